#!/usr/bin/env bash
# Fails when hack/update-gomod.sh would change go.mod or go.sum.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
"$REPO_ROOT/hack/update-gomod.sh"
git diff --exit-code -- go.mod go.sum hack/tools/kube/go.mod hack/tools/kube/go.sum hack/tools/etcd/go.mod hack/tools/etcd/go.sum \
  || die "go.mod/go.sum not tidy (run hack/update-gomod.sh and commit)"
log "go.mod tidy"
