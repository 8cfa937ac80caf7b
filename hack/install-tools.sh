#!/usr/bin/env bash
# Installs everything the local cluster and the tests need: etcd, kwok/kwokctl,
# the Kubernetes control-plane binaries and kubectl, the func CLI and the
# distribution registry. Idempotent; fast with a warm cache.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$REPO_ROOT/hack/install-etcd.sh"
"$REPO_ROOT/hack/install-kwok.sh"
"$REPO_ROOT/hack/install-kube.sh"
"$REPO_ROOT/hack/install-func.sh"
"$REPO_ROOT/hack/install-registry.sh"
