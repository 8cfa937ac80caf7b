#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager and kubectl from the
# k8s.io/kubernetes module (no downloads of prebuilt binaries are possible here)
# and caches them outside the repository. A warm cache returns at once.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# KUBE_COMPONENTS picks a subset (hack/install-node.sh builds kubelet and kube-proxy).
read -r -a components <<< "${KUBE_COMPONENTS:-kube-apiserver kube-scheduler kube-controller-manager kubectl}"
missing=()
for c in "${components[@]}"; do
  [[ -x "$KUBE_BIN_DIR/$c" ]] || missing+=("$c")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "kubernetes $KUBE_VERSION binaries cached in $KUBE_BIN_DIR"
  exit 0
fi

mkdir -p "$KUBE_BIN_DIR"
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

cd "$REPO_ROOT/hack/tools/kube"
# One go build for every missing binary: the packages they share (most of
# k8s.io/kubernetes) compile once, and the links run in parallel.
pkgs=()
for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
tmp=$(mktemp -d "$KUBE_BIN_DIR/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building ${missing[*]} $KUBE_VERSION in one go build (first build takes minutes on 2 cores; cached afterwards)"
retrying run_with_progress "kubernetes ${missing[*]}" go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
for c in "${missing[@]}"; do mv "$tmp/$c" "$KUBE_BIN_DIR/$c"; done
