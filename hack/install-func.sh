#!/usr/bin/env bash
# Installs the func CLI (knative.dev/func), pinned, from the Go module proxy into
# the cache. v0.48.4 is the newest that builds here: v0.50.1 needs modules the
# proxy refuses. The tests and `make image` use this binary, never one on PATH.
#
# Built from a copy of the module with hack/patches/func-<version>-*.patch
# applied: `--platform` with the host builder (func refuses it, though its
# builder takes platforms), so an image for this machine's node is built for
# its one platform, not three. A change of the patches rebuilds it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

shopt -s nullglob
patches=("$REPO_ROOT"/hack/patches/func-"$FUNC_VERSION"-*.patch)
stamp=$(cat /dev/null "${patches[@]}" | sha256sum | cut -c1-16)
if [[ -x "$FUNC_BIN" && "$(cat "$FUNC_BIN.patches" 2>/dev/null)" == "$stamp" ]]; then
  log "func $FUNC_VERSION cached at $FUNC_BIN"
  exit 0
fi
mkdir -p "$(dirname "$FUNC_BIN")"
log "installing the func CLI $FUNC_VERSION from its module source, with ${#patches[@]} patch(es) (about 7 minutes the first time)"
cd "$CACHE_DIR"
dir=$(go mod download -json "knative.dev/func@$FUNC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$dir" ]] || die "go mod download knative.dev/func@$FUNC_VERSION gave no directory"
ldflags="-s -w -X knative.dev/func/pkg/version.Vers=$FUNC_VERSION -X knative.dev/func/pkg/version.Kver=$FUNC_KNATIVE_VERSION -X knative.dev/func/pkg/version.Hash=module-proxy"
# Into a scratch copy (the module cache is read-only), then the binary into
# place with its stamp, so an interrupted build never leaves a stale pair.
src=$(mktemp -d "$(dirname "$FUNC_BIN")/.src-XXXXXX")
trap 'rm -rf "$src"' EXIT
cp -r "$dir/." "$src" && chmod -R u+w "$src"
for p in "${patches[@]}"; do
  patch -s -d "$src" -p1 <"$p"
done
cd "$src"
tmp="$FUNC_BIN.tmp.$$"
CGO_ENABLED=0 GOFLAGS=-trimpath retrying run_with_progress "func" go build -ldflags "$ldflags" -o "$tmp" ./cmd/func
mv "$tmp" "$FUNC_BIN"
printf '%s\n' "$stamp" >"$FUNC_BIN.patches"
"$FUNC_BIN" version >&2
