#!/usr/bin/env bash
# `make test`: the four tiers in order (unit, e2e, make run, Knative), with
# real Knative's build started first, in the background, at idle CPU
# priority. Only the last tier needs it, and it is the longest build there is
# (Serving, Eventing, Traefik, CoreDNS: about ten minutes of both cores
# cold), so it takes the cycles the other tiers leave idle (module downloads,
# single-threaded links, an e2e test waiting on a Pod) and no tier waits for
# it but the one that uses it. in_background (hack/lib.sh: SCHED_IDLE, and
# its session's autogroup at nice 19) runs it only when nothing else wants a
# core, so the tests' timings do not feel it.
#
# With a warm cache the build returns at once. A background build that
# fails is not the end: make test-knative builds again in the foreground,
# and that failure is the one reported.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

mkdir -p "$CACHE_DIR"
knlog="$CACHE_DIR/knative-build.log"
log "building real Knative in the background at idle priority (log: $knlog)"
setsid --wait bash -c 'source hack/lib.sh && in_background hack/install-knative.sh' >"$knlog" 2>&1 &
knpid=$!
trap 'kill -- "-$knpid" 2>/dev/null || true' EXIT

# Every tier runs even when an earlier one failed (they test different
# things, and a CI run should say all it can); make test fails at the end,
# naming the tiers that failed.
failed=() times=()
tier() {
  local start=$SECONDS
  make --no-print-directory "$1" || failed+=("$1")
  times+=("$(printf '%-22s %5d s' "$1" $((SECONDS - start)))")
}
tier test-unit
tier test-e2e
tier test-run
start=$SECONDS
if wait "$knpid"; then
  log "real Knative's background build: done ($((SECONDS - start)) s waited for it here)"
else
  log "real Knative's background build failed (its log's last lines below); building it in the foreground"
  tail -n 20 "$knlog" >&2
fi
times+=("$(printf '%-22s %5d s' "waiting for Knative" $((SECONDS - start)))")
trap - EXIT
tier test-knative
# Where the time went, tier by tier, whatever failed.
log "make test: tier times"
printf '    %s\n' "${times[@]}" >&2
[[ ${#failed[@]} -eq 0 ]] || die "make test: ${failed[*]} failed (each tier's output is above; its last lines name the failed tests)"
log "make test: every tier passed"
