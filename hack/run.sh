#!/usr/bin/env bash
# `make run`: serves the function on 127.0.0.1:8080. Without KUBECONFIG it
# brings up the local kwok cluster first. Honours PROVISIONER_API_KEY and
# LISTEN_ADDRESS; otherwise generates a key and prints a ready-to-paste curl.
#
# NODE=real (`make run NODE=real`) also joins the real test node to that
# cluster, so sandboxes run in real containers and their URLs answer: the
# stand-in sandbox image by default, or an operator's own image from an
# archive (SANDBOX_IMAGE_TAR=path/to/image.tar SANDBOX_IMAGE=its/reference).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin=${1:?usage: hack/run.sh path/to/provisioner}
NODE=${NODE:-kwok}
[[ "$NODE" == kwok || "$NODE" == real ]] || die "NODE=$NODE: use NODE=kwok (the default) or NODE=real"
if [[ "$NODE" == real ]]; then
  [[ -z "${KUBECONFIG:-}${KUBECONFIG_PATH:-}" ]] || die "NODE=real joins a node to the local cluster; unset KUBECONFIG"
  [[ $EUID -eq 0 ]] || die "NODE=real runs containers, network namespaces and iptables: run as root"
  # A cluster of its own: one made by an earlier plain `make run` may let kwok
  # manage every node, the real one included.
  export CLUSTER_NAME=${CLUSTER_NAME:-sandbox-dev}-real
  "$REPO_ROOT/hack/node-images.sh"
fi
if [[ -z "${KUBECONFIG:-}" && -z "${KUBECONFIG_PATH:-}" ]]; then
  KUBECONFIG=$("$REPO_ROOT/hack/cluster-up.sh")
  export KUBECONFIG
  export NODE_HOST=${NODE_HOST:-127.0.0.1}
  log "using the local cluster: export KUBECONFIG=$KUBECONFIG"
fi
# The function builds after the cluster's tools: hack/tools/kube pins the
# same versions of client-go and its dependencies as go.mod, so on a cold
# cache most of the function's packages were compiled moments ago.
log "building the function into $bin"
mkdir -p "$(dirname "$bin")"
(cd "$REPO_ROOT" && go build -trimpath -ldflags "${LDFLAGS:--s -w}" -o "$bin" ./cmd/provisioner)
export LISTEN_ADDRESS=${LISTEN_ADDRESS:-127.0.0.1:8080}
if [[ -z "${PROVISIONER_API_KEY:-}" ]]; then
  PROVISIONER_API_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export PROVISIONER_API_KEY
  log "generated a development API key (set PROVISIONER_API_KEY to choose your own)"
fi
# A local cluster has no config/ applied: let the function create the shared
# NetworkPolicy that isolates sandboxes (it creates none until it exists).
export SANDBOX_NETWORK_POLICY_ENSURE=${SANDBOX_NETWORK_POLICY_ENSURE:-true}

if [[ "$NODE" == real ]]; then
  state="$CACHE_DIR/run-real-node"
  mkdir -p "$state"
  envfile="$state/function.env"
  rm -f "$envfile"
  log "building the real node's launcher"
  (cd "$REPO_ROOT" && go build -o "$state/realnode-up" ./test/framework/realnode/cmd/realnode-up)
  args=(-kubeconfig "$KUBECONFIG" -pki-dir "$(dirname "$KUBECONFIG")/pki" -host-base "$state/deer-flow" -env-file "$envfile")
  if [[ -n "${SANDBOX_IMAGE_TAR:-}" ]]; then
    [[ -n "${SANDBOX_IMAGE:-}" ]] || die "SANDBOX_IMAGE_TAR needs SANDBOX_IMAGE, the reference of the image inside it"
    args+=(-image-tar "$SANDBOX_IMAGE_TAR" -image "$SANDBOX_IMAGE")
  fi
  log "joining the real node (log: $state/realnode.log)"
  "$state/realnode-up" "${args[@]}" >"$state/realnode.log" 2>&1 &
  node_pid=$!
  trap 'kill -TERM "$node_pid" 2>/dev/null; wait "$node_pid" 2>/dev/null' EXIT
  for _ in $(seq 1 300); do
    [[ -f "$envfile" ]] && break
    kill -0 "$node_pid" 2>/dev/null || { tail -n 20 "$state/realnode.log" >&2; die "the real node did not start"; }
    sleep 1
  done
  [[ -f "$envfile" ]] || die "the real node was not Ready in 300 s (log: $state/realnode.log)"
  while IFS='=' read -r k v; do export "$k=$v"; done <"$envfile"
  log "real node Ready: sandboxes run in real containers (image $SANDBOX_IMAGE)"
fi

url="http://$LISTEN_ADDRESS"
cat >&2 <<MSG

  Provisioner on $url    API key: $PROVISIONER_API_KEY

  curl -s -X POST $url/api/sandboxes -H 'X-API-Key: $PROVISIONER_API_KEY' -H 'Content-Type: application/json' -d '{"sandbox_id":"abcd1234","thread_id":"t1"}'
  curl -s $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  curl -s -X DELETE $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  func invoke --target $url --format http --data '{"operation":"list","api_key":"$PROVISIONER_API_KEY"}'

MSG
if [[ "$NODE" == real ]]; then
  # Not exec: the trap above takes the node down when the function stops.
  "$bin"
else
  exec "$bin"
fi
