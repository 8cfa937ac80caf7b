#!/usr/bin/env bash
# `make run`: serves the function on 127.0.0.1:8080. Without KUBECONFIG it
# brings up the local kwok cluster first. Honours PROVISIONER_API_KEY and
# LISTEN_ADDRESS; otherwise generates a key and prints a ready-to-paste curl.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin=${1:?usage: hack/run.sh path/to/provisioner}
if [[ -z "${KUBECONFIG:-}" && -z "${KUBECONFIG_PATH:-}" ]]; then
  KUBECONFIG=$("$REPO_ROOT/hack/cluster-up.sh")
  export KUBECONFIG
  export NODE_HOST=${NODE_HOST:-127.0.0.1}
  log "using the local cluster: export KUBECONFIG=$KUBECONFIG"
fi
export LISTEN_ADDRESS=${LISTEN_ADDRESS:-127.0.0.1:8080}
if [[ -z "${PROVISIONER_API_KEY:-}" ]]; then
  PROVISIONER_API_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export PROVISIONER_API_KEY
  log "generated a development API key (set PROVISIONER_API_KEY to choose your own)"
fi
# A local cluster has no config/ applied: let the function create the shared
# NetworkPolicy that isolates sandboxes (it creates none until it exists).
export SANDBOX_NETWORK_POLICY_ENSURE=${SANDBOX_NETWORK_POLICY_ENSURE:-true}
url="http://$LISTEN_ADDRESS"
cat >&2 <<MSG

  Provisioner on $url    API key: $PROVISIONER_API_KEY

  curl -s -X POST $url/api/sandboxes -H 'X-API-Key: $PROVISIONER_API_KEY' -H 'Content-Type: application/json' -d '{"sandbox_id":"abcd1234","thread_id":"t1"}'
  curl -s $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  curl -s -X DELETE $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  func invoke --target $url --format http --data '{"operation":"list","api_key":"$PROVISIONER_API_KEY"}'

MSG
exec "$bin"
