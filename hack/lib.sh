#!/usr/bin/env bash
# Shared settings for the hack/ scripts. Source it; do not run it.

set -o errexit -o nounset -o pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
# Built binaries live outside the repository, keyed by version, so a fresh clone
# reuses what an earlier clone on this machine already built.
CACHE_DIR=${SANDBOX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-provisioner}
KUBE_BIN_DIR="$CACHE_DIR/kube-$KUBE_VERSION"
KWOK_BIN_DIR="$CACHE_DIR/kwok-$KWOK_VERSION"
ETCD_VERSION=${ETCD_VERSION:-v3.6.5}
ETCD_BIN=${ETCD_BIN:-$CACHE_DIR/etcd-$ETCD_VERSION/etcd}
FUNC_VERSION=${FUNC_VERSION:-v0.48.4}
FUNC_KNATIVE_VERSION=${FUNC_KNATIVE_VERSION:-knative-v1.18.0}
FUNC_BIN=${FUNC_BIN:-$CACHE_DIR/func-$FUNC_VERSION/func}
IMAGE_DIR=${IMAGE_DIR:-$CACHE_DIR/image}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CNI_VERSION=${CNI_VERSION:-v1.9.1}
KNP_VERSION=${KNP_VERSION:-v0.7.0}
NODE_BIN_DIR=${NODE_BIN_DIR:-$CACHE_DIR/node-containerd-$CONTAINERD_VERSION-knp-$KNP_VERSION}
CNI_BIN_DIR=${CNI_BIN_DIR:-$CACHE_DIR/cni-$CNI_VERSION}
# gVisor (runsc and containerd's shim containerd-shim-runsc-v1) for the real
# node's `runsc` runtime handler: the pseudo-version the module proxy gave as
# @latest (gVisor tags no module versions).
GVISOR_VERSION=${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}
GVISOR_BIN_DIR=${GVISOR_BIN_DIR:-$CACHE_DIR/gvisor-$GVISOR_VERSION}
NODE_IMAGES_DIR=${NODE_IMAGES_DIR:-$CACHE_DIR/node-images}
CLUSTER_NAME=${CLUSTER_NAME:-sandbox-dev}
KWOK_WORKDIR=${KWOK_WORKDIR:-$CACHE_DIR/kwok-clusters}

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# cluster_ready reports whether the local kwok cluster $CLUSTER_NAME is up:
# its kubeconfig exists and its API server answers /readyz.
cluster_ready() {
  local dir="$KWOK_WORKDIR/clusters/$CLUSTER_NAME" server
  [[ -f "$dir/kubeconfig.yaml" ]] || return 1
  server=$(sed -n 's/^ *server: //p' "$dir/kubeconfig.yaml" | head -n1)
  [[ "$(curl -sS --max-time 5 --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" "$server/readyz" 2>/dev/null)" == ok ]]
}

# go_build_env runs Go's compiles and links without its garbage collector
# until a process's heap reaches GO_BUILD_MEMLIMIT (the collector then
# keeps it there). Measured on this project's etcd build from an empty
# cache, that is a quarter less CPU (64 s of user time against 90 s). Ten
# compiles at once (five builds side by side) stay within 15 GiB.
go_build_env=(GOGC=off "GOMEMLIMIT=${GO_BUILD_MEMLIMIT:-1536MiB}")

# go, for the scripts that source this file: `go build` and `go install`
# in go_build_env. Only the build steps: `go test` would hand the setting
# to the binaries it runs, and `go run` to the program.
go() {
  case ${1:-} in
    build | install) env "${go_build_env[@]}" go "$@" ;;
    *) command go "$@" ;;
  esac
}

# run_with_progress prints a line every 10 s while a long step runs, so CI
# logs and terminals show that it is alive, and at the end the wall time
# and the CPU time it took (its processes' user and system seconds), which
# say what a cold run spends its two cores on.
run_with_progress() {
  local label=$1; shift
  local start=$SECONDS
  (
    rc=0 tf=$(mktemp)
    "$@" || rc=$?
    # The second line of `times` is this subshell's reaped children; into
    # a file, as a pipe would run it in a fresh process that has none.
    times >"$tf"
    awk -v l="$label" 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } }
      END { printf "\033[1;34m==>\033[0m %s: %.0f s of CPU\n", l, t }' "$tf" >&2
    rm -f "$tf"
    exit "$rc"
  ) &
  local pid=$!
  local ticks=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ((++ticks % 10 == 0)) && kill -0 "$pid" 2>/dev/null && log "$label: still working ($((SECONDS - start))s)"
  done
  # Its status by hand: called where errexit does not apply (retrying's
  # `"$@" && return 0`), a bare wait that failed would go on to say done,
  # and a failed build would pass for a built one.
  local rc=0
  wait "$pid" || rc=$?
  if [[ $rc -ne 0 ]]; then
    log "$label: failed (exit $rc) after $((SECONDS - start))s"
    return "$rc"
  fi
  log "$label: done in $((SECONDS - start))s"
}
# side_by_side LABEL=COMMAND...: runs each COMMAND (a script or a function,
# no arguments) in the background, its lines prefixed with [LABEL], waits
# for all of them and dies naming those that failed. Cold, a build spends
# much of its time fetching modules, which overlaps with another's compiling.
side_by_side() {
  local pids=() labels=() failed=() spec i
  for spec in "$@"; do
    labels+=("${spec%%=*}")
    ("${spec#*=}" 2>&1 | sed -u "s/^/[${spec%%=*}] /" >&2) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed+=("${labels[$i]}")
  done
  [[ ${#failed[@]} -eq 0 ]] || die "${failed[*]} failed (see the lines starting with [${failed[0]}]; run again to retry: what was built is cached)"
}
# Real Knative on the real node (make knative): versions the module proxy
# serves (see hack/tools/{knative-serving,knative-eventing,traefik,coredns}).
KNATIVE_SERVING_VERSION=${KNATIVE_SERVING_VERSION:-v0.50.0}
KNATIVE_EVENTING_VERSION=${KNATIVE_EVENTING_VERSION:-v0.50.0}
TRAEFIK_VERSION=${TRAEFIK_VERSION:-v3.6.12}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# The cache keys of the two builds that leave parts out (hack/install-knative.sh).
COREDNS_TAG=coredns-$COREDNS_VERSION-corefile-plugins
TRAEFIK_TAG=traefik-$TRAEFIK_VERSION-no-lego-dns
KNATIVE_BIN_DIR=${KNATIVE_BIN_DIR:-$CACHE_DIR/knative-bin}
KNATIVE_IMAGES_DIR=${KNATIVE_IMAGES_DIR:-$CACHE_DIR/knative-images}

# in_background COMMAND...: runs COMMAND so that it takes only the CPU that
# nothing else wants: the scheduler's idle policy (SCHED_IDLE) at nice 19,
# and, since the kernel shares CPU between sessions (autogroups) before it
# looks at either, its session's autogroup at nice 19 too. Call it in a
# session of its own (setsid): otherwise it lowers the caller's group.
# Where chrt cannot set the policy (a container without the capability),
# nice alone.
in_background() {
  echo 19 >/proc/self/autogroup 2>/dev/null || true
  if chrt --idle 0 true 2>/dev/null; then chrt --idle 0 nice -n 19 "$@"; else nice -n 19 "$@"; fi
}

# retrying COMMAND...: runs COMMAND up to three times, 10 s and then 20 s
# apart, until it succeeds. Go fetches modules without retrying, and one
# TLS handshake that times out on the module proxy failed a cold CI run's
# Knative build; a second try of a build finds what the first compiled in
# Go's cache, so a real compile error costs little more to report.
retrying() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    [[ $try -lt 3 ]] || break
    log "${*:1:3} … failed (try $try of 3); trying again in $((try * 10)) s"
    sleep $((try * 10))
  done
  return 1
}

# go_install DIR PKG@VERSION...: go install into a scratch directory beside
# DIR, then each binary into DIR by rename. The scripts take a binary that
# exists for a cached one, so one that an interrupted copy left half-written
# must never appear under its name. Build settings (CGO_ENABLED, GOFLAGS)
# come from the caller's environment.
go_install() {
  local dir=$1 tmp f
  shift
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/.install-XXXXXX")
  if ! GOBIN=$tmp retrying go install "$@"; then rm -rf "$tmp"; return 1; fi
  for f in "$tmp"/*; do mv "$f" "$dir/"; done
  rmdir "$tmp"
}
