#!/usr/bin/env bash
# Installs everything the local cluster and the tests need: etcd, kwok/kwokctl,
# the Kubernetes control-plane binaries and kubectl and the func CLI.
# Idempotent; fast with a warm cache. (The registry the tests push to is
# go-containerregistry's, built with the tests: test/framework/registry.)
#
# The four are independent, so they install side by side (side_by_side: the
# cold run's tools stage, one after another, took 532 s on two cores).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

h=$REPO_ROOT/hack
side_by_side etcd="$h/install-etcd.sh" kwok="$h/install-kwok.sh" kube="$h/install-kube.sh" \
  func="$h/install-func.sh"
