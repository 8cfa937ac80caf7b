#!/usr/bin/env bash
# Installs the distribution registry (the reference OCI registry) from its Go
# module into the cache. Tests start it on 127.0.0.1 to push images to.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$REGISTRY_BIN" ]]; then
  log "registry $REGISTRY_VERSION cached at $REGISTRY_BIN"
  exit 0
fi
mkdir -p "$(dirname "$REGISTRY_BIN")"
log "installing the distribution registry $REGISTRY_VERSION (about 2 minutes the first time)"
cd "$CACHE_DIR"
export CGO_ENABLED=0 GOFLAGS=-trimpath
run_with_progress "registry" go_install "$(dirname "$REGISTRY_BIN")" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
