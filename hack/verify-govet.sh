#!/usr/bin/env bash
# go vet over every package, including the build-tagged end-to-end suite.
# One pass with the e2e tag is every file: no file here is built only
# without it (no !e2e constraint), so a second, untagged pass vetted nothing
# more and cost a cold run a pass over every package.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
if grep -rlE --include='*.go' '^//go:build .*!e2e' . | grep -v '^./hack/tools/' | grep -q .; then
  go vet ./...
fi
go vet -tags e2e ./...
log "go vet clean"
