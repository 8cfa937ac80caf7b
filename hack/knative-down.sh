#!/usr/bin/env bash
# `make knative-down`: takes the local Knative cluster (make knative) down:
# its launcher undoes the real node's changes to this machine and deletes the
# control plane; the /etc/hosts line make deploy-local added goes too.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

state="$CACHE_DIR/knative-cluster"
if [[ -f "$state/pid" ]] && pid=$(cat "$state/pid") && kill -0 "$pid" 2>/dev/null; then
  log "taking the Knative cluster down"
  kill -TERM "$pid"
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$pid" 2>/dev/null && die "the launcher ($pid) is still running after 120 s"
else
  log "no Knative cluster is running"
fi
rm -f "$state/pid" "$state/kubeconfig-path"
"$REPO_ROOT/hack/hosts.sh" remove
