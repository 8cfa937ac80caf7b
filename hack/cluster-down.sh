#!/usr/bin/env bash
# Deletes the local kwok cluster and its data. The cached binaries stay.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export KWOK_WORKDIR
if [[ -x "$KWOK_BIN_DIR/kwokctl" ]]; then
  "$KWOK_BIN_DIR/kwokctl" --name "$CLUSTER_NAME" delete cluster >/dev/null 2>&1 || true
fi
rm -rf "$KWOK_WORKDIR/clusters/$CLUSTER_NAME"
log "cluster $CLUSTER_NAME deleted"
