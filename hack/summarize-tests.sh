#!/usr/bin/env bash
# Passes `go test -v` output through and ends with one plain line
# "N passed, N failed, N skipped" for CI; exits non-zero when go test failed.
set -o nounset -o pipefail
pass=0 fail=0 skip=0 status=0
while IFS= read -r line; do
  printf '%s\n' "$line"
  case "$line" in
    *"--- PASS:"*) pass=$((pass + 1)) ;;
    *"--- FAIL:"*) fail=$((fail + 1)) ;;
    *"--- SKIP:"*) skip=$((skip + 1)) ;;
    FAIL*) status=1 ;;
  esac
done
echo "e2e: $pass passed, $fail failed, $skip skipped"
[[ $fail -eq 0 && $status -eq 0 ]]
