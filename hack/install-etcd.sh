#!/usr/bin/env bash
# Builds etcd 3.6 from the Go module proxy (hack/tools/etcd) into the cache.
# Debian's etcd-server is 3.4: it lacks the watch progress notifications that
# watch-list clients need, and with it kwok takes 30-50 s to run a Pod.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$ETCD_BIN" ]]; then
  log "etcd $ETCD_VERSION cached at $ETCD_BIN"
  exit 0
fi
mkdir -p "$(dirname "$ETCD_BIN")"
log "building etcd $ETCD_VERSION (about a minute the first time)"
cd "$REPO_ROOT/hack/tools/etcd"
retrying run_with_progress "etcd" go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN.tmp" .
mv "$ETCD_BIN.tmp" "$ETCD_BIN"
