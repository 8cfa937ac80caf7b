#!/usr/bin/env bash
# Tidies go.mod/go.sum of the main module and the tools module.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT" && go mod tidy
cd "$REPO_ROOT/hack/tools/kube" && go mod tidy
cd "$REPO_ROOT/hack/tools/etcd" && go mod tidy
