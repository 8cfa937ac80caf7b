#!/usr/bin/env bash
# `make deploy-local`: deploys the function to the local Knative cluster
# (make knative) as `make deploy` would to a real one: builds the
# function's image and its side images (the egress proxy's, the E2B
# router's and agent's), pushes them to a registry on this machine (the
# node's containerd pulls them from there by digest) and applies config/
# through the test overlay test/overlays/knative-local (only the images'
# digests, a generated API key Secret, a generated E2B token key Secret and
# what this cluster needs differ). Waits until the Knative Service, the
# Broker, the Triggers, the PingSource, the egress proxy and the E2B router
# are Ready, then prints FUNCTION_URL=…, PROVISIONER_API_KEY=… and
# KUBECONFIG=… on stdout.
#
# FUNCTION_URL is the function's own cluster-local route
# (http://sandbox-provisioner.deer-flow.svc.cluster.local), reached through
# Traefik's KIngress: a line in /etc/hosts (hack/hosts.sh) names the
# KIngress's private address for it, as cluster DNS would in a Pod.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

state="$CACHE_DIR/knative-cluster"
if [[ -z "${KUBECONFIG:-}" ]]; then
  [[ -f "$state/kubeconfig-path" ]] || die "no local Knative cluster: run make knative first (or set KUBECONFIG)"
  KUBECONFIG=$(cat "$state/kubeconfig-path")
fi
export KUBECONFIG
KUBE_COMPONENTS=kubectl "$REPO_ROOT/hack/install-kube.sh"
kubectl="$KUBE_BIN_DIR/kubectl"
NS=deer-flow

# The registry the node pulls from: containerd talks plain HTTP to loopback.
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5001}
reg="$CACHE_DIR/local-registry-${REGISTRY_ADDR//[:.]/-}"
if ! curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; then
  log "starting a registry on $REGISTRY_ADDR (data in $reg)"
  mkdir -p "$reg"
  # The test registry (test/framework/registry), built from this module.
  (cd "$REPO_ROOT" && go build -trimpath -ldflags "-s -w" -o "$reg/registry" ./test/framework/registry/cmd/registry)
  setsid nohup "$reg/registry" -addr "$REGISTRY_ADDR" -dir "$reg/blobs" >"$reg/registry.log" 2>&1 </dev/null &
  echo $! >"$reg/pid"
  for _ in $(seq 1 50); do curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null || die "the registry on $REGISTRY_ADDR did not start (log: $reg/registry.log)"
fi

# The claims' directories on the node (test/overlays/knative-local/volumes.yaml),
# the skills claim in DeerFlow's layout: a sandbox mounts it read-only at
# /mnt/skills, and DeerFlow's extra mount of skills_view/custom lands on
# /mnt/skills/custom inside it, which must exist there (the runtime cannot
# make a mount point in a read-only mount).
mkdir -p /var/lib/sandbox-provisioner/knative-local/{skills/public,skills/custom,user-data}

# The API key: the cluster's own if it has one, else a new one. It lives
# only in the cluster's Secret and this script's output.
"$kubectl" apply -f "$REPO_ROOT/config/100-namespace.yaml" >/dev/null
key=$("$kubectl" -n "$NS" get secret sandbox-provisioner -o jsonpath='{.data.api-key}' 2>/dev/null | base64 -d || true)
if [[ -z "$key" ]]; then
  key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  "$kubectl" -n "$NS" create secret generic sandbox-provisioner --from-literal=api-key="$key" --dry-run=client -o yaml |
    "$kubectl" apply -f - >/dev/null
  log "generated the API key Secret $NS/sandbox-provisioner"
fi

# E2B's token key (docs/e2b.md), which the function and the router share:
# the cluster's own if it has one (its sandboxes' tokens stay valid), else
# a new one, made before the function's revision that mounts it starts.
if ! "$kubectl" -n "$NS" get secret sandbox-e2b-key >/dev/null 2>&1; then
  # create, not apply: should the get above have failed for another
  # reason, an existing key is never overwritten.
  "$kubectl" -n "$NS" create secret generic sandbox-e2b-key --from-literal=key="$(head -c 48 /dev/urandom | base64 -w0)" >/dev/null
  log "generated the E2B token key Secret $NS/sandbox-e2b-key"
fi

# The images for this machine's node only (hack/image.sh; the proxy's,
# hack/proxy-image.sh, is this machine's by default, as are the router's
# and the agent's). deploy.sh names them
# $REGISTRY_ADDR/deer-flow/sandbox-egress-proxy:local, …/sandbox-router:local
# and …/sandbox-envd:local, beside the function's.
PLATFORM="linux/$(go env GOARCH)" KUSTOMIZE_DIR="$REPO_ROOT/test/overlays/knative-local" "$REPO_ROOT/hack/deploy.sh" "$REGISTRY_ADDR/deer-flow/sandbox-provisioner:local" >&2

log "waiting for the Knative Service, the Broker, the Triggers and the PingSource to be Ready"
for what in ksvc/sandbox-provisioner broker/default "triggers --all" "pingsources --all" "eventpolicies --all"; do
  # shellcheck disable=SC2086 # "kind --all" is two arguments
  "$kubectl" -n "$NS" wait --for=condition=Ready --timeout=300s $what >&2
done
# The egress proxy allowlist sandboxes go through, pulled from the local
# registry: a pull or start failure shows here, not at the first allowlist
# create.
log "waiting for the egress proxy's replicas"
"$kubectl" -n "$NS" rollout status deployment/sandbox-egress-proxy --timeout=180s >&2
# The E2B router likewise: E2B clients reach no sandbox without it.
log "waiting for the E2B router's replicas"
"$kubectl" -n "$NS" rollout status deployment/sandbox-router --timeout=180s >&2

url=$("$kubectl" -n "$NS" get ksvc sandbox-provisioner -o jsonpath='{.status.url}')
host=${url#*://}
ip=$("$kubectl" -n traefik get service traefik-private -o jsonpath='{.spec.clusterIP}')
[[ -n "$host" && -n "$ip" ]] || die "no route URL ($url) or no KIngress address ($ip)"
"$REPO_ROOT/hack/hosts.sh" set "$host" "$ip"
for _ in $(seq 1 60); do
  [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health/readiness")" == 200 ]] && break
  sleep 1
done
[[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health/readiness")" == 200 ]] || die "$url/health/readiness does not answer 200 through the KIngress"
log "the function answers at $url (through Traefik's KIngress)"
echo "FUNCTION_URL=$url"
echo "PROVISIONER_API_KEY=$key"
echo "KUBECONFIG=$KUBECONFIG"
