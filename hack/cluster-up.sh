#!/usr/bin/env bash
# Brings up (or reuses) the local kwok cluster for `make run`: a real
# kube-apiserver, scheduler, controller-manager and etcd, plus fake nodes
# that advertise enough CPU, memory, pods and ephemeral storage for sandboxes.
# Prints the kubeconfig path on stdout.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=${KWOK_NODES:-2}
NAMESPACE=${K8S_NAMESPACE:-deer-flow}
# Only what the cluster runs: etcd, kwok and the control plane. The func
# CLI, the registry and kubectl serve the tests and deploys (make tools).
"$REPO_ROOT/hack/install-etcd.sh"
"$REPO_ROOT/hack/install-kwok.sh"
KUBE_COMPONENTS="kube-apiserver kube-scheduler kube-controller-manager" "$REPO_ROOT/hack/install-kube.sh"

export KWOK_WORKDIR KWOK_KUBE_VERSION="$KUBE_VERSION"
kwokctl="$KWOK_BIN_DIR/kwokctl"
kubeconfig="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/kubeconfig.yaml"
mkdir -p "$KWOK_WORKDIR"
kwoklog="$KWOK_WORKDIR/kwokctl-$CLUSTER_NAME.log"
# kwokctl logs JSON to stderr; keep it in a file and show it only on failure.
kwok() { "$kwokctl" --name "$CLUSTER_NAME" "$@" >>"$kwoklog" 2>&1 || { tail -n 20 "$kwoklog" >&2; die "kwokctl $1 $2 failed (log: $kwoklog)"; }; }

server() { sed -n 's/^ *server: //p' "$kubeconfig" | head -n1; }
pki="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki"
api() {
  curl -sS --fail-with-body --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$@"
}

if [[ -f "$kubeconfig" && "$(api "$(server)/readyz" 2>/dev/null)" == ok ]]; then
  log "reusing running cluster $CLUSTER_NAME"
else
  if [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
    # A stopped kwok cluster restarts with a kwok controller that no longer
    # moves Pods to Running; a dev cluster is cheap to make anew (~4 s).
    log "recreating stopped cluster $CLUSTER_NAME"
    "$kwokctl" --name "$CLUSTER_NAME" delete cluster >>"$kwoklog" 2>&1 || true
    rm -rf "$KWOK_WORKDIR/clusters/$CLUSTER_NAME"
  fi
  log "creating cluster $CLUSTER_NAME (kube $KUBE_VERSION, binary runtime)"
  # As the test clusters (test/framework/cluster): kwok fakes only its own
  # nodes, never a real one joined with `make run NODE=real`; each
  # component's first --extra-args comes before any component's second
  # (kwokctl v0.7.0 panics otherwise); NodePorts stay below the ports kwokctl
  # hands its components, which a real node's kube-proxy would otherwise take
  # over on 127.0.0.1; a real node's logs and exec go through the API server
  # to its kubelet by address, as kwok's admin (kubectl logs on a sandbox).
  # The API server's certificate also names the kubernetes Service's
  # ClusterIP, which in-cluster clients on a real node dial (the egress
  # proxy); only kwokctl's configuration file takes extra names.
  mkdir -p "$KWOK_WORKDIR"
  printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\noptions:\n  kubeApiserverCertSANs: [10.96.0.1]\n' >"$KWOK_WORKDIR/kwokctl-$CLUSTER_NAME.yaml"
  kwok --config "$KWOK_WORKDIR/kwokctl-$CLUSTER_NAME.yaml" create cluster --runtime binary \
    --kube-apiserver-binary "$KUBE_BIN_DIR/kube-apiserver" \
    --kube-scheduler-binary "$KUBE_BIN_DIR/kube-scheduler" \
    --kube-controller-manager-binary "$KUBE_BIN_DIR/kube-controller-manager" \
    --kwok-controller-binary "$KWOK_BIN_DIR/kwok" \
    --etcd-binary "$ETCD_BIN" \
    --extra-args kube-apiserver=service-cluster-ip-range=10.96.0.0/16 \
    --extra-args kwok-controller=manage-all-nodes=false \
    --extra-args kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --extra-args kube-apiserver=service-node-port-range=30000-31999 \
    --extra-args kube-apiserver=kubelet-preferred-address-types=InternalIP \
    --extra-args "kube-apiserver=kubelet-client-certificate=$pki/admin.crt" \
    --extra-args "kube-apiserver=kubelet-client-key=$pki/admin.key" \
    --kubeconfig "$KWOK_WORKDIR/kubeconfig-merged" \
    --timeout 120s
fi

server=$(server)

log "waiting for the API server at $server"
for _ in $(seq 1 60); do
  [[ "$(api "$server/readyz" 2>/dev/null)" == ok ]] && break
  sleep 1
done
[[ "$(api "$server/readyz" 2>/dev/null)" == ok ]] || die "API server at $server did not become ready"

have=$(api "$server/api/v1/nodes" | grep -c '"kwok.x-k8s.io/node"' || true)
if (( have < NODES )); then
  log "adding $NODES kwok nodes"
  kwok scale node --replicas "$NODES" \
    --param '.allocatable.cpu=1000' --param '.allocatable.memory="4Ti"' \
    --param '.allocatable.pods=5000' --param '.allocatable["ephemeral-storage"]="10Ti"'
fi

if ! api "$server/api/v1/namespaces/$NAMESPACE" >/dev/null 2>&1; then
  log "creating namespace $NAMESPACE"
  api -X POST -H 'Content-Type: application/json' "$server/api/v1/namespaces" \
    -d "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"$NAMESPACE\"}}" >/dev/null
fi
# The API server refuses Pods in a namespace until the controller manager
# has made its default ServiceAccount, a moment after the namespace: the
# cluster is up for sandboxes only then.
for _ in $(seq 1 120); do
  api "$server/api/v1/namespaces/$NAMESPACE/serviceaccounts/default" >/dev/null 2>&1 && break
  sleep 0.5
done
api "$server/api/v1/namespaces/$NAMESPACE/serviceaccounts/default" >/dev/null 2>&1 ||
  die "the controller manager made no ServiceAccount default in namespace $NAMESPACE within 60 s (log: $kwoklog)"
log "cluster $CLUSTER_NAME is up"
echo "$kubeconfig"
