#!/usr/bin/env bash
# Fails when go.mod or go.sum of the module or of a wrapper module under
# hack/tools is not tidy (hack/update-gomod.sh fixes it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
"$REPO_ROOT/hack/update-gomod.sh"
git diff --exit-code -- go.mod go.sum 'hack/tools/*/go.mod' 'hack/tools/*/go.sum' \
  || die "go.mod/go.sum not tidy (run hack/update-gomod.sh and commit)"
log "go.mod tidy"
