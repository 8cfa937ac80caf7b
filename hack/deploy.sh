#!/usr/bin/env bash
# Builds the function's image and its side images (the egress proxy's, the
# E2B router's and the E2B agent's), pushes them to the registry you name,
# and applies config/ with each image pinned to its pushed digest: the
# router's Deployment, and the function's SANDBOX_ENVD_IMAGE, which
# templates annotated sandbox.deerflow.dev/envd put into their sandboxes.
#
#   hack/deploy.sh IMAGE            e.g. registry.example.com/team/sandbox-provisioner:v1
#   DRY_RUN=1 hack/deploy.sh IMAGE  build and push, print the manifests, apply nothing
#   KUSTOMIZE_DIR=DIR hack/deploy.sh IMAGE   apply DIR instead of config/, e.g. the
#                                   one hack/deerflow-chart-overlay.sh writes
#   PROXY_IMAGE=REF hack/deploy.sh IMAGE     the egress proxy's name:tag; by default
#                                   IMAGE's with the last path element replaced by
#                                   sandbox-egress-proxy (…/team/sandbox-egress-proxy:v1)
#   ROUTER_IMAGE=REF, ENVD_IMAGE=REF  the same for the E2B router's and agent's
#                                   (…/team/sandbox-router:v1, …/team/sandbox-envd:v1)
#   PROXY_GOARCH=arm64 hack/deploy.sh IMAGE  the architecture of the proxy's, the
#                                   router's and the agent's images (default this
#                                   machine's; amd64 or arm64): each holds one,
#                                   while the function's holds func's three. The
#                                   agent runs in the sandboxes: their nodes'.
#
# config/kustomization.yaml is the deployable unit (`kubectl apply -k config/`);
# this overlays it in a temporary directory, so the repository is not edited
# (kustomize takes only relative paths to a base).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGE=${1:-${IMAGE:-}}
[[ -z "${KUSTOMIZE_DIR:-}" || -f "$KUSTOMIZE_DIR/kustomization.yaml" ]] || die "KUSTOMIZE_DIR=$KUSTOMIZE_DIR has no kustomization.yaml"
[[ -n "$IMAGE" ]] || die "IMAGE is required: make deploy IMAGE=registry.example.com/team/sandbox-provisioner:tag"
[[ "$IMAGE" != *@* ]] || die "IMAGE=$IMAGE: give a name and tag; the digest comes from the push"
# The proxy's image goes beside the function's: the same registry and
# repository path (where your credentials already push the function's) and
# the same tag, so the two images of one deploy are found together.
last=${IMAGE##*/}
tag=
[[ "$last" == *:* ]] && tag=":${last##*:}"
prefix=
[[ "$IMAGE" == */* ]] && prefix="${IMAGE%/*}/"
PROXY_IMAGE=${PROXY_IMAGE:-${prefix}sandbox-egress-proxy$tag}
ROUTER_IMAGE=${ROUTER_IMAGE:-${prefix}sandbox-router$tag}
ENVD_IMAGE=${ENVD_IMAGE:-${prefix}sandbox-envd$tag}
for pair in "PROXY_IMAGE=$PROXY_IMAGE" "ROUTER_IMAGE=$ROUTER_IMAGE" "ENVD_IMAGE=$ENVD_IMAGE"; do
  [[ "$pair" != *@* ]] || die "$pair: give a name and tag; the digest comes from the push"
done
"$REPO_ROOT/hack/install-kube.sh"
KUBECTL="$KUBE_BIN_DIR/kubectl"

# repository is a reference's name without its tag.
repository() {
  local ref=$1 last=${1##*/}
  [[ "$last" == *:* ]] && ref=${ref%:*}
  echo "$ref"
}

# The side images first: each builds and pushes in seconds, so a registry
# that refuses a push fails the deploy before the function's minutes of
# building. GOARCH only here: kubectl and func must stay this machine's.
# Each script writes its digest only after its push succeeded.
side_arch=${PROXY_GOARCH:-$(go env GOARCH)}
PUSH=1 IMAGE="$PROXY_IMAGE" GOARCH=$side_arch "$REPO_ROOT/hack/proxy-image.sh"
proxy_digest=$(cat "$IMAGE_DIR/proxy-digest")
proxy_name=$(repository "$PROXY_IMAGE")
PUSH=1 IMAGE="$ROUTER_IMAGE" GOARCH=$side_arch "$REPO_ROOT/hack/router-image.sh"
router_digest=$(cat "$IMAGE_DIR/router-digest")
router_name=$(repository "$ROUTER_IMAGE")
PUSH=1 IMAGE="$ENVD_IMAGE" GOARCH=$side_arch "$REPO_ROOT/hack/envd-image.sh"
envd_ref="$(repository "$ENVD_IMAGE")@$(cat "$IMAGE_DIR/envd-digest")"

# Every platform func builds, unless PLATFORM names one (deploy-local.sh:
# this machine's).
PUSH=1 PLATFORM=${PLATFORM:-all} "$REPO_ROOT/hack/image.sh" "$IMAGE"
digest=$(cat "$IMAGE_DIR/digest")
name=$IMAGE
[[ "$last" == *:* ]] && name=${name%:*}

overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
# The agent's image is a setting of the function (SANDBOX_ENVD_IMAGE), not
# an image field kustomize's images: can pin: a replacement sets it from
# this ConfigMap, which kustomize reads and never applies (local-config).
cat > "$overlay/envd-image.yaml" <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: deploy-envd-image
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  image: $envd_ref
YAML
cat > "$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$overlay" "${KUSTOMIZE_DIR:-$REPO_ROOT/config}")
  - envd-image.yaml
images:
  - name: deploy.invalid/sandbox-provisioner
    newName: $name
    digest: $digest
  # config/300-egress-proxy.yaml's and 310-router.yaml's placeholders,
  # which no registry serves.
  - name: deploy.invalid/sandbox-egress-proxy
    newName: $proxy_name
    digest: $proxy_digest
  - name: deploy.invalid/sandbox-router
    newName: $router_name
    digest: $router_digest
replacements:
  - source: {version: v1, kind: ConfigMap, name: deploy-envd-image, fieldPath: data.image}
    targets:
      - select: {group: serving.knative.dev, kind: Service, name: sandbox-provisioner}
        fieldPaths: ["spec.template.spec.containers.[name=provisioner].env.[name=SANDBOX_ENVD_IMAGE].value"]
YAML
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  "$KUBECTL" kustomize "$overlay"
  exit 0
fi
log "applying config/ with $name@$digest, $proxy_name@$proxy_digest, $router_name@$router_digest and SANDBOX_ENVD_IMAGE=$envd_ref"
"$KUBECTL" apply -k "$overlay"
