#!/usr/bin/env bash
# Builds the images the real test node runs, as OCI image archives containerd
# imports (nothing can be pulled here): pause (the Pod sandbox image), the
# sandbox stand-in (test/images/sandbox), kube-network-policies and the
# egress proxy (cmd/proxy). Each is one
# static binary in an otherwise empty image (test/images/mkimage).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$REPO_ROOT/hack/install-node.sh"
mkdir -p "$NODE_IMAGES_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$REPO_ROOT"
log "building the real node's images into $NODE_IMAGES_DIR"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause" ./test/images/pause
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/sandbox" ./test/images/sandbox
"$work/mkimage" -ref localhost/pause:e2e -out "$NODE_IMAGES_DIR/pause.tar" -user 65535:65535 "$work/pause"
"$work/mkimage" -ref localhost/sandbox:e2e -out "$NODE_IMAGES_DIR/sandbox.tar" -user 1000:1000 "$work/sandbox"
"$work/mkimage" -ref "localhost/kube-network-policies:$KNP_VERSION-xtq" -out "$NODE_IMAGES_DIR/kube-network-policies.tar" \
  -entrypoint /bin/netpol "$NODE_BIN_DIR/kube-network-policies"
# The egress proxy (cmd/proxy), which allowlist sandboxes go through.
"$REPO_ROOT/hack/proxy-image.sh"
log "images: $(cd "$NODE_IMAGES_DIR" && ls)"
