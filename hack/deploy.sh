#!/usr/bin/env bash
# Builds the image, pushes it to the registry you name, and applies config/
# with the image pinned to the pushed digest.
#
#   hack/deploy.sh IMAGE            e.g. registry.example.com/team/sandbox-provisioner:v1
#   DRY_RUN=1 hack/deploy.sh IMAGE  build and push, print the manifests, apply nothing
#   KUSTOMIZE_DIR=DIR hack/deploy.sh IMAGE   apply DIR instead of config/, e.g. the
#                                   one hack/deerflow-chart-overlay.sh writes
#
# config/kustomization.yaml is the deployable unit (`kubectl apply -k config/`);
# this overlays it in a temporary directory, so the repository is not edited
# (kustomize takes only relative paths to a base).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGE=${1:-${IMAGE:-}}
[[ -z "${KUSTOMIZE_DIR:-}" || -f "$KUSTOMIZE_DIR/kustomization.yaml" ]] || die "KUSTOMIZE_DIR=$KUSTOMIZE_DIR has no kustomization.yaml"
[[ -n "$IMAGE" ]] || die "IMAGE is required: make deploy IMAGE=registry.example.com/team/sandbox-provisioner:tag"
[[ "$IMAGE" != *@* ]] || die "IMAGE=$IMAGE: give a name and tag; the digest comes from the push"
"$REPO_ROOT/hack/install-kube.sh"
KUBECTL="$KUBE_BIN_DIR/kubectl"

# Every platform func builds, unless PLATFORM names one (deploy-local.sh:
# this machine's).
PUSH=1 PLATFORM=${PLATFORM:-all} "$REPO_ROOT/hack/image.sh" "$IMAGE"
digest=$(cat "$IMAGE_DIR/digest")
name=$IMAGE
last=${name##*/}
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
YAML
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  "$KUBECTL" kustomize "$overlay"
  exit 0
fi
log "applying config/ with $name@$digest"
"$KUBECTL" apply -k "$overlay"
