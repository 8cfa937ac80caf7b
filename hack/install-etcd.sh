#!/usr/bin/env bash
# Installs Debian's etcd server. Only its binary is used: the cluster tooling
# starts it itself, so no system service is enabled or needed.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -x "$ETCD_BIN" ]]; then
  log "etcd present at $ETCD_BIN"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "etcd is missing and installing it needs root: apt-get install etcd-server"
log "installing Debian's etcd-server"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
[[ -x "$ETCD_BIN" ]] || die "etcd-server installed but $ETCD_BIN is missing"
