#!/usr/bin/env bash
# Installs the func CLI (knative.dev/func), pinned, from the Go module proxy into
# the cache. v0.48.4 is the newest that builds here: v0.50.1 needs modules the
# proxy refuses. The tests and `make image` use this binary, never one on PATH.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$FUNC_BIN" ]]; then
  log "func $FUNC_VERSION cached at $FUNC_BIN"
  exit 0
fi
mkdir -p "$(dirname "$FUNC_BIN")"
log "installing the func CLI $FUNC_VERSION from its module source (about 7 minutes the first time)"
cd "$CACHE_DIR"
dir=$(go mod download -json "knative.dev/func@$FUNC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$dir" ]] || die "go mod download knative.dev/func@$FUNC_VERSION gave no directory"
# The same version variables func's Makefile sets, so `func version` is honest.
ldflags="-s -w -X knative.dev/func/pkg/version.Vers=$FUNC_VERSION -X knative.dev/func/pkg/version.Kver=$FUNC_KNATIVE_VERSION -X knative.dev/func/pkg/version.Hash=module-proxy"
cd "$dir"
tmp="$FUNC_BIN.tmp.$$"
run_with_progress "func" env CGO_ENABLED=0 GOFLAGS=-trimpath go build -ldflags "$ldflags" -o "$tmp" ./cmd/func
mv "$tmp" "$FUNC_BIN"
"$FUNC_BIN" version >&2
