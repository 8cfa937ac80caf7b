#!/usr/bin/env bash
# Formats every Go file in the repository.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
git ls-files -co --exclude-standard '*.go' | xargs gofmt -s -w
