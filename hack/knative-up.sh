#!/usr/bin/env bash
# `make knative`: builds real Knative from the Go module proxy (Serving,
# Eventing, Traefik's KIngress, CoreDNS; hack/install-knative.sh) and brings
# up the local Knative cluster: a kwok control plane whose kwok nodes are
# tainted, the real node on this machine that runs every Pod, and Knative
# installed from its upstream manifests (test/framework/knative). The cluster
# stays up in the background until `make knative-down`. Prints KUBECONFIG=…
# on stdout.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $EUID -eq 0 ]] || die "the Knative cluster's real node runs containers, network namespaces and iptables: run as root"
state="$CACHE_DIR/knative-cluster"
mkdir -p "$state"
if [[ -f "$state/pid" ]] && kill -0 "$(cat "$state/pid")" 2>/dev/null && [[ -f "$state/kubeconfig-path" ]]; then
  log "the Knative cluster is already up (make knative-down takes it down)"
  echo "KUBECONFIG=$(cat "$state/kubeconfig-path")"
  exit 0
fi

"$REPO_ROOT/hack/install-etcd.sh"
"$REPO_ROOT/hack/install-kwok.sh"
KUBE_COMPONENTS="kube-apiserver kube-scheduler kube-controller-manager kubectl" "$REPO_ROOT/hack/install-kube.sh"
"$REPO_ROOT/hack/node-images.sh"
"$REPO_ROOT/hack/install-knative.sh"

log "building the Knative cluster's launcher"
(cd "$REPO_ROOT" && go build -o "$state/knative-up" ./test/framework/knative/cmd/knative-up)
rm -f "$state/kubeconfig-path"
log "bringing up the Knative cluster (log: $state/knative-up.log)"
setsid nohup "$state/knative-up" -state "$state" -repo "$REPO_ROOT" >"$state/knative-up.log" 2>&1 </dev/null &
echo $! >"$state/pid"
start=$SECONDS
shown=0
while [[ ! -f "$state/kubeconfig-path" ]]; do
  kill -0 "$(cat "$state/pid")" 2>/dev/null || { tail -n 30 "$state/knative-up.log" >&2; die "the Knative cluster did not come up"; }
  (( SECONDS - start < 900 )) || { tail -n 30 "$state/knative-up.log" >&2; die "the Knative cluster was not up after 900 s"; }
  # Progress: the launcher's new log lines.
  lines=$(wc -l <"$state/knative-up.log")
  if (( lines > shown )); then
    tail -n +$((shown + 1)) "$state/knative-up.log" | sed -nE 's/^[0-9/]+ [0-9:]+ (INFO|WARN|ERROR) //p' | while read -r l; do log "knative: $l"; done
    shown=$lines
  fi
  sleep 2
done
log "Knative cluster up in $((SECONDS - start))s"
echo "KUBECONFIG=$(cat "$state/kubeconfig-path")"
