#!/usr/bin/env bash
# Passes `go test -v` output through and ends with one plain line
# "N passed, N failed, N skipped" for CI; exits non-zero when go test failed,
# and, under CI (CI set to a true value: true, 1, yes, in any case, as
# test/framework/skip reads it), when any test was skipped, naming each: a
# skip there would pass off as green a test that never ran.
set -o nounset -o pipefail
pass=0 fail=0 skip=0 status=0
skipped=() toplevel=()
while IFS= read -r line; do
  printf '%s\n' "$line"
  case "$line" in
    "--- PASS: "* | "--- FAIL: "*) toplevel+=("${line#--- * }") ;;&
    *"--- PASS:"*) pass=$((pass + 1)) ;;
    *"--- FAIL:"*) fail=$((fail + 1)) ;;
    *"--- SKIP:"*)
      skip=$((skip + 1))
      name=${line#*--- SKIP: }
      skipped+=("${name%% *}")
      ;;
    FAIL*) status=1 ;;
  esac
done
# The slowest top-level tests, so a run that got slower says where.
if [[ ${#toplevel[@]} -gt 0 ]]; then
  echo "slowest tests:"
  printf '%s\n' "${toplevel[@]}" | sed -n 's/^\([^ ]*\) (\([0-9.]*\)s)$/\2 \1/p' | sort -rn | head -n 10 |
    awk '{printf "  %8.1f s  %s\n", $1, $2}'
fi
echo "e2e: $pass passed, $fail failed, $skip skipped"

# The same spellings as skip.Truthy: strconv.ParseBool's true, and y/yes/on.
ci=$(printf '%s' "${CI:-}" | tr '[:upper:]' '[:lower:]' | tr -d '[:space:]')
case "$ci" in
  1 | t | true | y | yes | on)
    if [[ $skip -gt 0 ]]; then
      echo "CI=${CI}: failing, as $skip test(s) skipped: ${skipped[*]}"
      status=1
    fi
    ;;
esac
[[ $fail -eq 0 && $status -eq 0 ]]
