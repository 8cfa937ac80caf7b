#!/usr/bin/env bash
# Builds the egress proxy's image (cmd/proxy), the way hack/node-images.sh
# builds the sandbox stand-in: one static binary in an otherwise empty image
# (test/images/mkimage), run as a non-root user.
#
#   hack/proxy-image.sh        an OCI image archive for the real test node:
#                              $NODE_IMAGES_DIR/proxy.tar, image
#                              localhost/sandbox-egress-proxy:e2e
#   PUSH=1 IMAGE=registry.example.com/team/sandbox-egress-proxy:v1 hack/proxy-image.sh
#                              the same image pushed there (make deploy);
#                              the pushed digest goes to $IMAGE_DIR/proxy-digest
#
# The image is for this machine's architecture, or GOARCH's if set
# (linux/amd64 or linux/arm64: mkimage reads it from the binary). INSECURE=1
# pushes over plain HTTP to a registry that is not on loopback (loopback,
# e.g. the local registry on 127.0.0.1:5001, is plain HTTP already).
# Credentials come from your Docker config and its helpers, as for the
# function's image.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$REPO_ROOT"
# mkimage runs here, so it is built for this machine even when GOARCH names
# another for the proxy.
CGO_ENABLED=0 GOOS=$(go env GOHOSTOS) GOARCH=$(go env GOHOSTARCH) go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o "$work/proxy" ./cmd/proxy

if [[ "${PUSH:-0}" != 1 ]]; then
  mkdir -p "$NODE_IMAGES_DIR"
  log "building the egress proxy's image into $NODE_IMAGES_DIR/proxy.tar"
  "$work/mkimage" -ref localhost/sandbox-egress-proxy:e2e -out "$NODE_IMAGES_DIR/proxy.tar" -user 65532:65532 "$work/proxy"
  exit 0
fi

IMAGE=${IMAGE:-}
[[ -n "$IMAGE" ]] || die "PUSH=1 needs IMAGE=registry.example.com/team/sandbox-egress-proxy:tag"
[[ "$IMAGE" != *@* ]] || die "IMAGE=$IMAGE: give a name and tag; the digest comes from the push"
args=(-push "$IMAGE" -user 65532:65532)
[[ "${INSECURE:-0}" == 1 ]] && args+=(-insecure)
mkdir -p "$IMAGE_DIR"
# The digest file is written only after a push succeeded: deploy.sh must
# never pin a digest from an earlier run.
rm -f "$IMAGE_DIR/proxy-digest"
digest=$("$work/mkimage" "${args[@]}" "$work/proxy")
[[ "$digest" == sha256:* ]] || die "mkimage printed no digest: $digest"
printf '%s\n' "$digest" > "$IMAGE_DIR/proxy-digest"
log "pushed the egress proxy's image $IMAGE@$digest (linux/$(go env GOARCH))"
