#!/usr/bin/env bash
# Fails when hack/update-gofmt.sh would change anything.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
bad=$(git ls-files -co --exclude-standard '*.go' | xargs gofmt -s -l)
[[ -z "$bad" ]] || die "gofmt needed (run hack/update-gofmt.sh): $bad"
log "gofmt clean"
