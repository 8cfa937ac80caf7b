#!/usr/bin/env bash
# Builds the function's image and the egress proxy's, pushes both to the
# registry you name, and applies config/ with each image pinned to its
# pushed digest.
#
#   hack/deploy.sh IMAGE            e.g. registry.example.com/team/sandbox-provisioner:v1
#   DRY_RUN=1 hack/deploy.sh IMAGE  build and push, print the manifests, apply nothing
#   KUSTOMIZE_DIR=DIR hack/deploy.sh IMAGE   apply DIR instead of config/, e.g. the
#                                   one hack/deerflow-chart-overlay.sh writes
#   PROXY_IMAGE=REF hack/deploy.sh IMAGE     the egress proxy's name:tag; by default
#                                   IMAGE's with the last path element replaced by
#                                   sandbox-egress-proxy (…/team/sandbox-egress-proxy:v1)
#   PROXY_GOARCH=arm64 hack/deploy.sh IMAGE  the proxy's architecture (default this
#                                   machine's; amd64 or arm64): its image holds
#                                   one, while the function's holds func's three
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
[[ "$PROXY_IMAGE" != *@* ]] || die "PROXY_IMAGE=$PROXY_IMAGE: give a name and tag; the digest comes from the push"
"$REPO_ROOT/hack/install-kube.sh"
KUBECTL="$KUBE_BIN_DIR/kubectl"

# The proxy first: its build and push take seconds, so a registry that
# refuses the push fails the deploy before the function's minutes of
# building. GOARCH only here: kubectl and func must stay this machine's.
PUSH=1 IMAGE="$PROXY_IMAGE" GOARCH=${PROXY_GOARCH:-$(go env GOARCH)} "$REPO_ROOT/hack/proxy-image.sh"
proxy_digest=$(cat "$IMAGE_DIR/proxy-digest")
proxy_name=$PROXY_IMAGE
proxy_last=${proxy_name##*/}
[[ "$proxy_last" == *:* ]] && proxy_name=${proxy_name%:*}

# Every platform func builds, unless PLATFORM names one (deploy-local.sh:
# this machine's).
PUSH=1 PLATFORM=${PLATFORM:-all} "$REPO_ROOT/hack/image.sh" "$IMAGE"
digest=$(cat "$IMAGE_DIR/digest")
name=$IMAGE
[[ "$last" == *:* ]] && name=${name%:*}

overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
cat > "$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$overlay" "${KUSTOMIZE_DIR:-$REPO_ROOT/config}")
images:
  - name: ghcr.io/deerflow-sandbox/sandbox-provisioner
    newName: $name
    digest: $digest
  # config/300-egress-proxy.yaml's placeholder, which no registry serves.
  - name: sandbox-egress-proxy
    newName: $proxy_name
    digest: $proxy_digest
YAML
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  "$KUBECTL" kustomize "$overlay"
  exit 0
fi
log "applying config/ with $name@$digest and $proxy_name@$proxy_digest"
"$KUBECTL" apply -k "$overlay"
