#!/usr/bin/env bash
# Builds the sandbox router's image (cmd/router), the way
# hack/proxy-image.sh builds the egress proxy's: one static binary in an
# otherwise empty image (test/images/mkimage), run as a non-root user.
#
#   hack/router-image.sh       an OCI image archive for the real test node:
#                              $NODE_IMAGES_DIR/router.tar, image
#                              localhost/sandbox-router:e2e
#   PUSH=1 IMAGE=registry.example.com/team/sandbox-router:v1 hack/router-image.sh
#                              the same image pushed there (make deploy);
#                              the pushed digest goes to $IMAGE_DIR/router-digest
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
# another for the router.
CGO_ENABLED=0 GOOS=$(go env GOHOSTOS) GOARCH=$(go env GOHOSTARCH) go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o "$work/router" ./cmd/router

if [[ "${PUSH:-0}" != 1 ]]; then
  mkdir -p "$NODE_IMAGES_DIR"
  log "building the sandbox router's image into $NODE_IMAGES_DIR/router.tar"
  "$work/mkimage" -ref localhost/sandbox-router:e2e -out "$NODE_IMAGES_DIR/router.tar" -user 65532:65532 "$work/router"
  exit 0
fi

IMAGE=${IMAGE:-}
[[ -n "$IMAGE" ]] || die "PUSH=1 needs IMAGE=registry.example.com/team/sandbox-router:tag"
[[ "$IMAGE" != *@* ]] || die "IMAGE=$IMAGE: give a name and tag; the digest comes from the push"
args=(-push "$IMAGE" -user 65532:65532)
[[ "${INSECURE:-0}" == 1 ]] && args+=(-insecure)
mkdir -p "$IMAGE_DIR"
# The digest file is written only after a push succeeded: deploy.sh must
# never pin a digest from an earlier run.
rm -f "$IMAGE_DIR/router-digest"
digest=$("$work/mkimage" "${args[@]}" "$work/router")
[[ "$digest" == sha256:* ]] || die "mkimage printed no digest: $digest"
printf '%s\n' "$digest" > "$IMAGE_DIR/router-digest"
log "pushed the sandbox router's image $IMAGE@$digest (linux/$(go env GOARCH))"
