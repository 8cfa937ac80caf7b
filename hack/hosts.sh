#!/usr/bin/env bash
# Keeps one marked line in /etc/hosts for the local Knative cluster, so a
# client on this machine reaches the function's cluster-local route through
# the KIngress by its own name (what DeerFlow's backend would use in the
# cluster), with no extra headers.
#
#   hack/hosts.sh set HOST IP     add or replace the line
#   hack/hosts.sh remove          delete it
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mark="# sandbox-provisioner: local Knative cluster (make knative-down removes it)"
hosts=${HOSTS_FILE:-/etc/hosts}
# /etc/hosts may be a bind mount: rewrite it in place, never replace it.
keep=$(grep -vF -- "$mark" "$hosts" || true)
case ${1:-} in
  set)
    [[ -n ${2:-} && -n ${3:-} ]] || die "usage: hack/hosts.sh set HOST IP"
    printf '%s\n%s %s %s\n' "$keep" "$3" "$2" "$mark" >"$hosts"
    ;;
  remove)
    printf '%s\n' "$keep" >"$hosts"
    ;;
  *) die "usage: hack/hosts.sh set HOST IP | remove" ;;
esac
