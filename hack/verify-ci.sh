#!/usr/bin/env bash
# Fails unless a CI run cannot pass off a skipped test as green: .ci/run
# exports CI=true before its test stage; test/framework/skip reads CI (any
# true value) to fail instead of skip; hack/summarize-tests.sh, through which
# make pipes the e2e, make-run and Knative suites, fails under CI on any
# skip (checked by feeding it one) and passes without CI.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

bad=0
fail() { echo "$*" >&2; bad=1; }

export_line=$(grep -nx 'export CI=true' .ci/run | head -1 | cut -d: -f1)
test_line=$(grep -n '^stage test ' .ci/run | head -1 | cut -d: -f1)
if [[ -z $export_line ]]; then
  fail ".ci/run does not export CI=true"
elif [[ -z $test_line || $export_line -gt $test_line ]]; then
  fail ".ci/run exports CI=true after its test stage (or has none)"
fi

grep -q 'Truthy(os.Getenv("CI"))\|os.Getenv("CI"); Truthy(' test/framework/skip/skip.go ||
  fail "test/framework/skip/skip.go no longer decides by Truthy(os.Getenv(\"CI\"))"

for target in test-e2e test-run test-knative; do
  recipe=$(awk -v t="$target:" '$1 == t {on = 1; next} on && /^\t/ {print; next} {on = 0}' Makefile)
  grep -q ' test .*| hack/summarize-tests.sh' <<<"$recipe" ||
    fail "make $target does not pipe its go test through hack/summarize-tests.sh"
done

sample=$'=== RUN   TestShown\n--- PASS: TestShown (0.00s)\n=== RUN   TestNeverRan\n--- SKIP: TestNeverRan (0.00s)\nPASS\nok  \tx\t0.1s'
for ci in true 1 YES; do
  if out=$(CI=$ci hack/summarize-tests.sh <<<"$sample" 2>&1); then
    fail "hack/summarize-tests.sh passed a skipped test under CI=$ci"
  elif ! grep -q 'skipped: .*TestNeverRan' <<<"$out"; then
    fail "hack/summarize-tests.sh under CI=$ci did not name the skipped test: $out"
  fi
done
for ci in "" false 0; do
  CI=$ci hack/summarize-tests.sh <<<"$sample" >/dev/null 2>&1 ||
    fail "hack/summarize-tests.sh failed a run with a skip and CI='$ci' (only CI fails skips)"
done
# A failed test still fails without CI.
env -u CI hack/summarize-tests.sh <<<$'--- FAIL: TestBroken (0.00s)\nFAIL' >/dev/null 2>&1 &&
  fail "hack/summarize-tests.sh passed a failed test"

(( bad == 0 )) || die "CI could pass off a skipped test as green (see above)"
log "CI=true is exported by .ci/run, and under it a skip fails (skip.Unavailable, summarize-tests.sh)"
