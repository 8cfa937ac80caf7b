#!/usr/bin/env bash
# Writes a kustomization that deploys config/ for one release of DeerFlow's
# Helm chart (deploy/helm/deer-flow, installed with provisioner.enabled=false)
# and prints its directory.
#
#   hack/deerflow-chart-overlay.sh RELEASE [NAMESPACE]
#
#   RELEASE    the chart's release name (`helm install RELEASE ...`)
#   NAMESPACE  the chart's `namespace` value; default deer-flow, the chart's
#
# Environment:
#   OUT             directory to write into (default: a new temporary one)
#   API_KEY_SECRET  Secret holding PROVISIONER_API_KEY; default
#                   RELEASE-deer-flow-provider, the one the chart makes from
#                   its `secrets:` (set it to the chart's `existingSecret`)
#   SKILLS_CLAIM    the chart's skills.existingClaim; default deer-flow-skills
#   IMAGE           optional image reference (name:tag or name@sha256:...)
#
# Then: kubectl kustomize DIR, kubectl apply --server-side -k DIR, or
# make deploy IMAGE=... KUSTOMIZE_DIR=DIR.
#
# Why a script: config/overlays/deerflow-chart is a kustomize Component, not
# a kustomization of its own, because kustomize refuses an overlay that lies
# inside its base (config/). The release's values reach it through the
# local-config ConfigMap written here; the Component's replacements do the rest.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 RELEASE [NAMESPACE]"
release=$1
namespace=${2:-deer-flow}
api_key_secret=${API_KEY_SECRET:-$release-deer-flow-provider}
skills_claim=${SKILLS_CLAIM:-deer-flow-skills}

# Helm release names are DNS labels of at most 53 characters; the chart's
# names and the gateway's instance label derive from it.
[[ "$release" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ && ${#release} -le 53 ]] ||
  die "RELEASE=$release: a Helm release name is lowercase letters, digits and '-', at most 53 characters"
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ && ${#namespace} -le 63 ]] ||
  die "NAMESPACE=$namespace is not a namespace name"
for pair in "API_KEY_SECRET=$api_key_secret" "SKILLS_CLAIM=$skills_claim"; do
  [[ "${pair#*=}" =~ ^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$ && ${#pair} -le 270 ]] ||
    die "$pair is not an object name"
done
[[ -z "${IMAGE:-}" || "$IMAGE" =~ ^[^[:space:]]+$ ]] || die "IMAGE=$IMAGE is not an image reference"

out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/deerflow-chart.XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)

cat > "$out/release.yaml" <<YAML
# The DeerFlow Helm release config/overlays/deerflow-chart joins: read by
# kustomize (local-config), never applied.
apiVersion: v1
kind: ConfigMap
metadata:
  name: deerflow-chart
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  release: $release
  namespace: $namespace
  api-key-secret: $api_key_secret
  skills-claim: $skills_claim
YAML

{
  cat <<YAML
# Written by hack/deerflow-chart-overlay.sh $release $namespace
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$out" "$REPO_ROOT/config")
  - release.yaml
components:
  - $(realpath --relative-to="$out" "$REPO_ROOT/config/overlays/deerflow-chart")
YAML
  if [[ -n "${IMAGE:-}" ]]; then
    name=$IMAGE digest='' tag=''
    if [[ "$name" == *@* ]]; then digest=${name#*@}; name=${name%%@*}; fi
    last=${name##*/}
    if [[ "$last" == *:* ]]; then tag=${last#*:}; name=${name%:*}; fi
    printf 'images:\n  - name: deploy.invalid/sandbox-provisioner\n    newName: %s\n' "$name"
    [[ -z "$digest" ]] || printf '    digest: %s\n' "$digest"
    [[ -z "$tag" || -n "$digest" ]] || printf '    newTag: %s\n' "$tag"
  fi
} > "$out/kustomization.yaml"

echo "$out"
