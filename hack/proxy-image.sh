#!/usr/bin/env bash
# Builds the egress proxy's image (cmd/proxy) as an OCI image archive, the
# way hack/node-images.sh builds the sandbox stand-in: one static binary in
# an otherwise empty image (test/images/mkimage), run as a non-root user.
# Output: $NODE_IMAGES_DIR/proxy.tar, image localhost/sandbox-egress-proxy:e2e.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$NODE_IMAGES_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$REPO_ROOT"
log "building the egress proxy's image into $NODE_IMAGES_DIR/proxy.tar"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/proxy" ./cmd/proxy
"$work/mkimage" -ref localhost/sandbox-egress-proxy:e2e -out "$NODE_IMAGES_DIR/proxy.tar" -user 65532:65532 "$work/proxy"
