#!/usr/bin/env bash
# Builds the envd agent's image (cmd/envd), the way hack/proxy-image.sh
# builds the egress proxy's: one static binary, /envd, in an otherwise
# empty image (test/images/mkimage), run as a non-root user. A sandbox Pod
# runs it as an init container (`/envd install /opt/envd/envd`) that copies
# the binary into an emptyDir the sandbox container mounts; nothing of the
# template's own image changes.
#
#   hack/envd-image.sh         an OCI image archive for the real test node:
#                              $NODE_IMAGES_DIR/envd.tar, image
#                              localhost/sandbox-envd:e2e
#   PUSH=1 IMAGE=registry.example.com/team/sandbox-envd:v1 hack/envd-image.sh
#                              the same image pushed there (make deploy);
#                              the pushed digest goes to $IMAGE_DIR/envd-digest
#
# The image is for this machine's architecture, or GOARCH's if set
# (linux/amd64 or linux/arm64: mkimage reads it from the binary). INSECURE=1
# pushes over plain HTTP to a registry that is not on loopback. Credentials
# come from your Docker config and its helpers, as for the function's image.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$REPO_ROOT"
# mkimage runs here, so it is built for this machine even when GOARCH names
# another for the agent.
CGO_ENABLED=0 GOOS=$(go env GOHOSTOS) GOARCH=$(go env GOHOSTARCH) go build -trimpath -ldflags "-s -w" -o "$work/mkimage" ./test/images/mkimage
# Static (CGO_ENABLED=0): it runs in images with any libc or none.
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o "$work/envd" ./cmd/envd

if [[ "${PUSH:-0}" != 1 ]]; then
  mkdir -p "$NODE_IMAGES_DIR"
  log "building the envd agent's image into $NODE_IMAGES_DIR/envd.tar"
  "$work/mkimage" -ref localhost/sandbox-envd:e2e -out "$NODE_IMAGES_DIR/envd.tar" -user 65532:65532 "$work/envd"
  exit 0
fi

IMAGE=${IMAGE:-}
[[ -n "$IMAGE" ]] || die "PUSH=1 needs IMAGE=registry.example.com/team/sandbox-envd:tag"
[[ "$IMAGE" != *@* ]] || die "IMAGE=$IMAGE: give a name and tag; the digest comes from the push"
args=(-push "$IMAGE" -user 65532:65532)
[[ "${INSECURE:-0}" == 1 ]] && args+=(-insecure)
mkdir -p "$IMAGE_DIR"
# The digest file is written only after a push succeeded: a deploy must
# never pin a digest from an earlier run.
rm -f "$IMAGE_DIR/envd-digest"
digest=$("$work/mkimage" "${args[@]}" "$work/envd")
[[ "$digest" == sha256:* ]] || die "mkimage printed no digest: $digest"
printf '%s\n' "$digest" > "$IMAGE_DIR/envd-digest"
log "pushed the envd agent's image $IMAGE@$digest (linux/$(go env GOARCH))"
