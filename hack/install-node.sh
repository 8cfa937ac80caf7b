#!/usr/bin/env bash
# Installs the parts of the real test node (issue: a real node in the test
# cluster), all from the Go module proxy or Debian, cached outside the
# repository:
#   kubelet, kube-proxy      k8s.io/kubernetes $KUBE_VERSION (hack/tools/kube)
#   containerd, ctr, shim    github.com/containerd/containerd/v2 $CONTAINERD_VERSION
#   CNI plugins              bridge, host-local, loopback, portmap $CNI_VERSION
#   kube-network-policies    $KNP_VERSION with hack/patches (this kernel has no nft queue)
#   runsc, its shim          gvisor.dev/gvisor $GVISOR_VERSION with hack/patches (the `runsc` handler)
#   runc, iptables, nft      Debian
# Idempotent; a warm cache returns at once.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Debian packages first: the kubelet, containerd and kube-proxy need them.
need=()
command -v runc >/dev/null || need+=(runc)
command -v iptables >/dev/null || need+=(iptables)
command -v nft >/dev/null || need+=(nftables)
command -v conntrack >/dev/null || need+=(conntrack)
if [[ ${#need[@]} -gt 0 ]]; then
  log "installing Debian packages: ${need[*]}"
  [[ $(id -u) == 0 ]] || die "installing ${need[*]} needs root (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The rest are independent builds, side by side (side_by_side).
mkdir -p "$NODE_BIN_DIR" "$CNI_BIN_DIR"
cd "$CACHE_DIR"

# kubelet and kube-proxy, like the control plane.
build_kube() { KUBE_COMPONENTS="kubelet kube-proxy" "$REPO_ROOT/hack/install-kube.sh"; }

build_containerd() {
  if [[ ! -x "$NODE_BIN_DIR/containerd" || ! -x "$NODE_BIN_DIR/ctr" || ! -x "$NODE_BIN_DIR/containerd-shim-runc-v2" ]]; then
    log "building containerd $CONTAINERD_VERSION (about 2 minutes with a warm Go cache, more when cold)"
    CGO_ENABLED=0 GOFLAGS=-trimpath run_with_progress "containerd" go_install "$NODE_BIN_DIR" \
      "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
      "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
      "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  else
    log "containerd $CONTAINERD_VERSION cached in $NODE_BIN_DIR"
  fi
}

build_cni() {
  local missing=() p
  for p in main/bridge ipam/host-local main/loopback meta/portmap; do
    [[ -x "$CNI_BIN_DIR/${p#*/}" ]] || missing+=("github.com/containernetworking/plugins/plugins/$p@$CNI_VERSION")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "building CNI plugins $CNI_VERSION"
    CGO_ENABLED=0 GOFLAGS=-trimpath run_with_progress "cni" go_install "$CNI_BIN_DIR" "${missing[@]}"
  else
    log "CNI plugins $CNI_VERSION cached in $CNI_BIN_DIR"
  fi
}

# kube-network-policies: `go install …@v0.7.0` fails here (the proxy refuses
# to list versions and the checksum database does not know the module), so
# download the one version by name, copy its source, patch it and build.
build_knp() {
  if [[ ! -x "$NODE_BIN_DIR/kube-network-policies" ]]; then
    log "building kube-network-policies $KNP_VERSION (patched for xt NFQUEUE; about 2 minutes)"
    dir=$(GONOSUMDB=sigs.k8s.io/kube-network-policies GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kube-network-policies@$KNP_VERSION" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$dir" ]] || die "go mod download sigs.k8s.io/kube-network-policies@$KNP_VERSION gave no directory"
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    cp -r "$dir/." "$src" && chmod -R u+w "$src"
    patch -s -d "$src" -p1 < "$REPO_ROOT/hack/patches/kube-network-policies-$KNP_VERSION-xt-nfqueue.patch"
    (cd "$src" && run_with_progress "kube-network-policies" env CGO_ENABLED=0 GONOSUMDB=sigs.k8s.io/kube-network-policies \
      go build -trimpath -ldflags "-s -w" -o "$src/kube-network-policies.bin" ./cmd)
    mv "$src/kube-network-policies.bin" "$NODE_BIN_DIR/kube-network-policies"
  else
    log "kube-network-policies $KNP_VERSION cached in $NODE_BIN_DIR"
  fi
}

# gVisor: runsc and containerd's shim for it, containerd-shim-runsc-v1
# (Debian's runsc package is years old and ships no shim). Built from one
# copy of the module with hack/patches applied: the shim insists on lowering
# its own OOM score, which root here cannot (no CAP_SYS_RESOURCE), and would
# refuse every Pod. Into a scratch directory first, so an interrupted build
# never leaves a half-cached pair.
build_gvisor() {
  if [[ ! -x "$GVISOR_BIN_DIR/runsc" || ! -x "$GVISOR_BIN_DIR/containerd-shim-runsc-v1" ]]; then
    log "building gVisor $GVISOR_VERSION: runsc and containerd-shim-runsc-v1 (about 2 minutes with a cold Go cache, 10 s warm)"
    dir=$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$dir" ]] || die "go mod download gvisor.dev/gvisor@$GVISOR_VERSION gave no directory"
    mkdir -p "$GVISOR_BIN_DIR"
    rm -rf "$GVISOR_BIN_DIR"/.build-* # an interrupted build's
    build=$(mktemp -d "$GVISOR_BIN_DIR/.build-XXXXXX")
    cp -r "$dir/." "$build/src" && chmod -R u+w "$build/src"
    for p in "$REPO_ROOT"/hack/patches/gvisor-"$GVISOR_VERSION"-*.patch; do
      patch -s -d "$build/src" -p1 < "$p"
    done
    (cd "$build/src" && run_with_progress "gvisor" env CGO_ENABLED=0 \
      go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
      -o "$build/" ./runsc ./shim)
    mv "$build/shim" "$GVISOR_BIN_DIR/containerd-shim-runsc-v1"
    mv "$build/runsc" "$GVISOR_BIN_DIR/runsc"
    rm -rf "$build"
  else
    log "gVisor $GVISOR_VERSION cached in $GVISOR_BIN_DIR"
  fi
}

side_by_side kube=build_kube containerd=build_containerd cni=build_cni kube-network-policies=build_knp gvisor=build_gvisor
