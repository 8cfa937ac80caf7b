#!/usr/bin/env bash
# Installs everything the local cluster needs: Debian's etcd, kwok/kwokctl and
# the Kubernetes control-plane binaries. Idempotent; fast with a warm cache.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$REPO_ROOT/hack/install-etcd.sh"
"$REPO_ROOT/hack/install-kwok.sh"
"$REPO_ROOT/hack/install-kube.sh"
