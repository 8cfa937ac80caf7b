#!/usr/bin/env bash
# Runs every fuzz target for a bounded time each (default 1m). New failing
# inputs land in the package's testdata/fuzz, which `make test` then replays.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fuzztime=${1:-1m}
cd "$REPO_ROOT"
targets=(
  "./pkg/sandbox/resources FuzzCreateRequest"
  "./pkg/sandbox/resources FuzzValidateID"
  "./pkg/events FuzzEvent"
  "./pkg/config FuzzConfig"
)
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  log "fuzzing $name in $pkg for $fuzztime"
  go test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" "$pkg"
done
