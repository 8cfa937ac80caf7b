#!/usr/bin/env bash
# go vet over every package, including the build-tagged end-to-end suite.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
go vet ./...
go vet -tags e2e ./...
log "go vet clean"
