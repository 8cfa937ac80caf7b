#!/usr/bin/env bash
# Tidies go.mod and go.sum of the module and of every wrapper module under
# hack/tools (each builds one tool from the module proxy).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT" && go mod tidy
for m in "$REPO_ROOT"/hack/tools/*/; do
  (cd "$m" && go mod tidy)
done
