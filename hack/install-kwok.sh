#!/usr/bin/env bash
# Installs kwok and kwokctl from the Go module proxy into the cache.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$KWOK_BIN_DIR/kwok" && -x "$KWOK_BIN_DIR/kwokctl" ]]; then
  log "kwok $KWOK_VERSION cached in $KWOK_BIN_DIR"
  exit 0
fi
mkdir -p "$KWOK_BIN_DIR"
log "installing kwok and kwokctl $KWOK_VERSION (about 3 minutes the first time)"
# Outside any module, so the repository's go.mod does not constrain kwok's dependencies.
cd "$CACHE_DIR"
export GOFLAGS=-trimpath
run_with_progress "kwok" go_install "$KWOK_BIN_DIR" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
