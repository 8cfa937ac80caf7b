#!/usr/bin/env bash
# Builds the function's OCI image offline with the func CLI's host builder (the
# builder `func deploy` uses), into an OCI layout outside the repository.
#
#   hack/image.sh [IMAGE]     IMAGE defaults to func.yaml's registry + name
#   PUSH=1 hack/image.sh IMAGE     also pushes it, as `func build --push` does
#
#   PLATFORM=linux/arm64 hack/image.sh   another platform; PLATFORM=all for
#                                   func's three (linux/amd64, arm64, arm/v7)
#
# By default the image is built for this machine's platform only: the
# tests, `make run NODE=real` and the local Knative cluster run it here, and
# the other two platforms cost a cold run three minutes of compiling for
# nothing (func refuses --platform for the host builder; hack/patches lets
# it). `make deploy`, for clusters whose nodes may differ, builds all three
# by the same builder from the same staged source and flags.
#
# func v0.48.4's host builder puts the function's whole directory into the
# image's /func layer and ignores .funcignore, and it rewrites func.yaml. So
# the build runs on a staged copy holding only the tracked files .funcignore
# keeps: the repository's func.yaml is never touched, and tests, fixtures,
# manifests and tooling never reach the image.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGE=${1:-${IMAGE:-}}
"$REPO_ROOT/hack/install-func.sh"

stage="$IMAGE_DIR/src"
rm -rf "$stage" && mkdir -p "$stage" "$IMAGE_DIR"
cd "$REPO_ROOT"
comm -23 <(git ls-files | sort) <(git ls-files --cached --ignored --exclude-from=.funcignore | sort) |
  tar -c -T - | tar -x -C "$stage"
log "staged $(find "$stage" -type f | wc -l) files for the image (tracked files minus .funcignore)"

# The scaffold's go.mod names only func-go and this module (by replace), so
# Go must complete its requirements from our go.mod: -mod=mod, from the
# module cache or proxy. -s drops symbols and DWARF (smaller image).
args=(build --builder=host --path "$stage")
PLATFORM=${PLATFORM:-linux/$(go env GOARCH)}
[[ "$PLATFORM" == all ]] || args+=(--platform "$PLATFORM")
[[ -n "$IMAGE" ]] && args+=(--image "$IMAGE")
[[ "${PUSH:-0}" == 1 ]] && args+=(--push)
cd "$stage"
# func's host builder runs go build itself: in hack/lib.sh's go_build_env.
run_with_progress "func build" env GOFLAGS="-mod=mod -trimpath -ldflags=-s" "${go_build_env[@]}" FUNC_VERBOSE=false "$FUNC_BIN" "${args[@]}"

rm -rf "$IMAGE_DIR/oci"
cp -r "$stage/.func/build/oci" "$IMAGE_DIR/oci"
built=$(cat "$stage/.func/built-image")
# The image's digest is that of its index, which a registry stores byte for
# byte: what a pull by digest and the deploy manifests name.
digest="sha256:$(sha256sum "$IMAGE_DIR/oci/index.json" | cut -d' ' -f1)"
printf '%s\n' "${built%@*}" > "$IMAGE_DIR/image"
printf '%s\n' "$digest" > "$IMAGE_DIR/digest"
log "image ${built%@*}@$digest in $IMAGE_DIR/oci"
