#!/usr/bin/env bash
# hack/create-path.sh: which files and packages a create passes through, in
# call order, counted from a trace of the running function (delve's `dlv
# trace` on every function of fn/ and pkg/; hack/tools/createpath counts).
# It measures the path docs/architecture.md walks through: a cold create of
# a new id through the DeerFlow door, a bare Pod with env and wait, after a
# first create (so per-principal policies are built and cached, as in
# steady state).
#
# Needs `make run` serving with symbols and without inlining of our code:
#   make run LDFLAGS='-X main.trace=1' GOFLAGS='-buildvcs=false -gcflags=github.com/deerflow-sandbox/...=-l'
# then, in a second shell, PROVISIONER_API_KEY=<the key it printed> hack/create-path.sh
# The function may not outlive the trace (delve detaching can leave a
# breakpoint behind): start make run again after.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

: "${PROVISIONER_API_KEY:?set PROVISIONER_API_KEY to the key make run printed}"
addr=${LISTEN_ADDRESS:-127.0.0.1:8080}
pid=$(pgrep -f "bin/provisioner" | head -1) || die "no function running: start make run as this script's header says"
dlv_dir="$CACHE_DIR/dlv-v1.27.2"
[[ -x $dlv_dir/dlv ]] || { log "installing delve into $dlv_dir"; go_install "$dlv_dir" github.com/go-delve/delve/cmd/dlv@v1.27.2; }
counter="$CACHE_DIR/createpath"
(cd hack/tools/createpath && go build -o "$counter" .)

create() {
  curl -sf -X POST "http://$addr/api/sandboxes?wait=20s" -H "X-API-Key: $PROVISIONER_API_KEY" \
    -H 'Content-Type: application/json' -d "{\"sandbox_id\":\"$1\",\"thread_id\":\"t1\",\"env\":{\"FOO\":\"bar\"}}" >/dev/null
}
suffix=$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')
create "path${suffix}a" || die "the first create failed"
trace=$(mktemp)
trap 'rm -f "$trace"' EXIT
# dlv trace sets a breakpoint on every function first (under a minute);
# the create comes after that, and the trace ends (detaching) at its timeout.
timeout 150 "$dlv_dir/dlv" trace --check-go-version=false -p "$pid" 'github.com/deerflow-sandbox/provisioner/(fn|pkg)/' >/dev/null 2>"$trace" &
tracer=$!
sleep 75
create "path${suffix}b" || die "the traced create failed"
log "traced; waiting for the trace to detach"
wait "$tracer" 2>/dev/null || true
# The request's own goroutine: the checks it starts side by side (the
# isolation verdicts) run only when a verdict is stale, so they are left out
# of the count, as are the transport wrappers every API call passes.
first=$(grep -m1 -oP '^> goroutine\(\K\d+(?=\): github.com/deerflow-sandbox/provisioner/pkg/reqid.Sanitize)' "$trace") || die "the trace holds no request"
plumbing='pkg/(kube/trace|metrics/|reqid/)'
GOROUTINES=$first SKIP=$plumbing "$counter" . "$trace"
GOROUTINES=$first SKIP=$plumbing UNIT=package VERBOSE=1 "$counter" . "$trace"
