#!/usr/bin/env bash
# `make run`: serves the function on 127.0.0.1:8080. Without KUBECONFIG it
# brings up the local kwok cluster first. Honours PROVISIONER_API_KEY and
# LISTEN_ADDRESS; otherwise generates a key and prints a ready-to-paste curl.
#
# NODE=real (`make run NODE=real`) also joins the real test node to that
# cluster, so sandboxes run in real containers and their URLs answer: the
# stand-in sandbox image by default, or an operator's own image from an
# archive (SANDBOX_IMAGE_TAR=path/to/image.tar SANDBOX_IMAGE=its/reference).
# It also serves E2B's SDK (docs/e2b.md): the router on the node, the token
# key (Secret sandbox-e2b-key, kept between runs), the agent's image and a
# template `base` carrying it; it prints E2B_API_URL, E2B_SANDBOX_URL and
# E2B_API_KEY ready to paste. Plain `make run` has no E2B: its sandboxes run
# nowhere (kwok), so no agent could answer.
#
# A NODE=real run that is stopped (Ctrl-C, SIGTERM) takes its node down. One
# that was killed (kill -9, a closed terminal) leaves it behind, and the next
# run ends what it left: the processes it recorded in its state directory
# (RUN_REAL_STATE, ~/.cache/sandbox-provisioner/run-real-node), then the
# node's parts, containers, mounts, network namespaces and rules (test/framework/realnode
# cleans those up before it starts a node). The cluster stays up between runs,
# with its sandboxes; the node adopts what an earlier node left in it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bin=${1:?usage: hack/run.sh path/to/provisioner}
NODE=${NODE:-kwok}
[[ "$NODE" == kwok || "$NODE" == real ]] || die "NODE=$NODE: use NODE=kwok (the default) or NODE=real"
export LISTEN_ADDRESS=${LISTEN_ADDRESS:-127.0.0.1:8080}

# starttime prints a process's start time (clock ticks since boot, field 22
# of /proc/<pid>/stat): with the pid, it tells the process recorded from a
# later one that reuses its pid.
starttime() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  # shellcheck disable=SC2086 # split into the stat fields
  set -- $s
  echo "${20}"
}

# parent prints a process's parent pid.
parent() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo "$2"
}

# alive PID START: the recorded process still runs.
alive() { [[ -n "$1" && "$(starttime "$1")" == "$2" ]]; }

# stop_leftovers ends what an earlier NODE=real run left running when it was
# killed: its real node's launcher first (SIGTERM: it takes the node down),
# then the function and the run itself. A run whose make (or shell) is still
# its parent is not a leftover but another live run: this one stops instead.
stop_leftovers() {
  local file=$1 role pid start ppid
  [[ -f "$file" ]] || return 0
  local -a roles=() pids=()
  while read -r role pid start ppid; do
    alive "$pid" "$start" || continue
    if [[ "$role" == run && "$(parent "$pid")" == "$ppid" ]]; then
      die "another \`make run NODE=real\` is running (pid $pid): stop it (Ctrl-C in its terminal, or kill $pid), then run again"
    fi
    roles+=("$role") pids+=("$pid")
  done <"$file"
  if [[ ${#pids[@]} -gt 0 ]]; then
    log "stopping what a killed \`make run NODE=real\` left running: ${roles[*]} (pids ${pids[*]})"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    # The node's Down takes up to a minute (containers, then its parts).
    for _ in $(seq 1 90); do
      local left=()
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
      [[ ${#left[@]} -eq 0 ]] && break
      sleep 1
    done
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  fi
  rm -f "$file"
}

# listening reports whether something accepts connections on host:port.
listening() {
  local host=${1%:*} port=${1##*:}
  host=${host#[} host=${host%]}
  [[ -z "$host" || "$host" == 0.0.0.0 || "$host" == :: ]] && host=127.0.0.1
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

if [[ "$NODE" == real ]]; then
  [[ -z "${KUBECONFIG:-}${KUBECONFIG_PATH:-}" ]] || die "NODE=real joins a node to the local cluster; unset KUBECONFIG and KUBECONFIG_PATH"
  [[ $EUID -eq 0 ]] || die "NODE=real runs containers, network namespaces and iptables: run it as root (sudo -E make run NODE=real)"
  if [[ -n "${SANDBOX_IMAGE_TAR:-}" ]]; then
    [[ -f "$SANDBOX_IMAGE_TAR" ]] || die "SANDBOX_IMAGE_TAR=$SANDBOX_IMAGE_TAR: no such file (an image archive: docker save, or an OCI archive)"
    [[ -n "${SANDBOX_IMAGE:-}" ]] || die "SANDBOX_IMAGE_TAR needs SANDBOX_IMAGE, the reference of the image inside it"
  fi
  # A cluster of its own: one made by an earlier plain `make run` may let kwok
  # manage every node, the real one included.
  export CLUSTER_NAME=${CLUSTER_NAME:-sandbox-dev}-real
  state=${RUN_REAL_STATE:-$CACHE_DIR/run-real-node}
  mkdir -p "$state"
  pidfile="$state/pids"
  stop_leftovers "$pidfile"
  echo "run $$ $(starttime $$) $PPID" >"$pidfile"
fi
if listening "$LISTEN_ADDRESS"; then
  who=$(ss -Hltnp "sport = :${LISTEN_ADDRESS##*:}" 2>/dev/null | sed -n 's/.*users:((\("[^"]*",pid=[0-9]*\).*/\1/p' | head -n1)
  die "$LISTEN_ADDRESS is taken${who:+ by $who} (another \`make run\`?): stop it, or serve on another address (LISTEN_ADDRESS=127.0.0.1:8081 make run …)"
fi
if [[ "$NODE" == real ]]; then
  "$REPO_ROOT/hack/node-images.sh"
fi
cluster_made=
if [[ -z "${KUBECONFIG:-}" && -z "${KUBECONFIG_PATH:-}" ]]; then
  cluster_ready || cluster_made=1
  KUBECONFIG=$("$REPO_ROOT/hack/cluster-up.sh")
  export KUBECONFIG
  export NODE_HOST=${NODE_HOST:-127.0.0.1}
  log "using the local cluster: export KUBECONFIG=$KUBECONFIG"
fi
# The function builds after the cluster's tools: hack/tools/kube pins the
# same versions of client-go and its dependencies as go.mod, so on a cold
# cache most of the function's packages were compiled moments ago.
log "building the function into $bin"
mkdir -p "$(dirname "$bin")"
(cd "$REPO_ROOT" && go build -trimpath -ldflags "${LDFLAGS:--s -w}" -o "$bin" ./cmd/provisioner)
if [[ -z "${PROVISIONER_API_KEY:-}" ]]; then
  PROVISIONER_API_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export PROVISIONER_API_KEY
  log "generated a development API key (set PROVISIONER_API_KEY to choose your own)"
fi
# A local cluster has no config/ applied: let the function create the shared
# NetworkPolicy that isolates sandboxes (it creates none until it exists).
export SANDBOX_NETWORK_POLICY_ENSURE=${SANDBOX_NETWORK_POLICY_ENSURE:-true}

# node_failed says why the real node did not start and what to do, after the
# EXIT trap has removed what this run started.
node_failed() {
  local why=$1 log=$state/realnode.log hint
  hint="run it again; if it fails the same way, start from a fresh cluster: make cluster-down CLUSTER_NAME=$CLUSTER_NAME (its sandboxes go with it)"
  if grep -q 'holds it (pid' "$log"; then
    hint="this machine runs one real node: stop the run or suite that holds it (the line above names it), then run again"
  elif grep -q 'is missing: ' "$log"; then
    hint="build the real node's parts: make node"
  elif grep -q 'is not installed: ' "$log"; then
    hint="install the node's Debian packages as root: hack/install-node.sh"
  elif grep -q 'importing .*\.tar\|holds no image' "$log"; then
    hint="SANDBOX_IMAGE_TAR must be an image archive (docker save, or an OCI archive) and SANDBOX_IMAGE the reference inside it (docker save writes it to manifest.json's RepoTags)"
  elif grep -q 'not within' "$log"; then
    hint="a part was too slow or failed (its log is in the lines above; REAL_NODE_KEEP_STATE=1 keeps every part's log under /tmp/rn-*): on a busy machine run it again; if it fails the same way, make cluster-down CLUSTER_NAME=$CLUSTER_NAME and run again"
  fi
  tail -n 20 "$log" >&2
  die "$why (log: $log)
  what to do: $hint"
}

if [[ "$NODE" == real ]]; then
  envfile="$state/function.env"
  # E2B's client side: the router's address, and the function's copy of
  # the token key (realnode-up writes both before $envfile).
  e2bfile="$state/e2b-client.env"
  e2bkey="$state/e2b-token-key"
  rm -f "$envfile" "$e2bfile"
  log "building the real node's launcher"
  (cd "$REPO_ROOT" && go build -o "$state/realnode-up" ./test/framework/realnode/cmd/realnode-up)
  args=(-kubeconfig "$KUBECONFIG" -pki-dir "$(dirname "$KUBECONFIG")/pki" -host-base "$state/deer-flow" -env-file "$envfile"
    -proxy-manifest "$REPO_ROOT/config/300-egress-proxy.yaml"
    -router-manifest "$REPO_ROOT/config/310-router.yaml" -router-policy "$REPO_ROOT/config/702-networkpolicy-router.yaml"
    -e2b-key-file "$e2bkey" -e2b-client-file "$e2bfile")
  if [[ -n "${SANDBOX_IMAGE_TAR:-}" ]]; then
    args+=(-image-tar "$SANDBOX_IMAGE_TAR" -image "$SANDBOX_IMAGE")
  fi
  log "joining the real node (log: $state/realnode.log)"
  "$state/realnode-up" "${args[@]}" >"$state/realnode.log" 2>&1 &
  node_pid=$!
  echo "node $node_pid $(starttime "$node_pid")" >>"$pidfile"
  node_up=
  # Whatever ends this run takes the node down; a run whose node never came
  # up also removes the cluster it made for it.
  cleanup() {
    kill -TERM "$node_pid" 2>/dev/null || true
    wait "$node_pid" 2>/dev/null || true
    if [[ -z "$node_up" && -n "$cluster_made" ]]; then
      log "removing cluster $CLUSTER_NAME, made for a node that did not start"
      "$REPO_ROOT/hack/cluster-down.sh" || true
    fi
    rm -f "$pidfile"
  }
  trap cleanup EXIT
  for _ in $(seq 1 300); do
    [[ -f "$envfile" ]] && break
    kill -0 "$node_pid" 2>/dev/null || { cleanup; trap - EXIT; node_failed "the real node did not start"; }
    sleep 1
  done
  [[ -f "$envfile" ]] || { cleanup; trap - EXIT; node_failed "the real node was not Ready in 300 s"; }
  node_up=1
  while IFS='=' read -r k v; do export "$k=$v"; done <"$envfile"
  log "real node Ready: sandboxes run in real containers (image $SANDBOX_IMAGE)"
  # Not exported: the client's setting, not the function's.
  e2b_sandbox_url=$(sed -n 's/^E2B_SANDBOX_URL=//p' "$e2bfile")
  [[ -n "$e2b_sandbox_url" ]] || die "the real node wrote no E2B_SANDBOX_URL to $e2bfile"
fi

url="http://$LISTEN_ADDRESS"
cat >&2 <<MSG

  Provisioner on $url    API key: $PROVISIONER_API_KEY

  curl -s -X POST $url/api/sandboxes -H 'X-API-Key: $PROVISIONER_API_KEY' -H 'Content-Type: application/json' -d '{"sandbox_id":"abcd1234","thread_id":"t1"}'
  curl -s $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  curl -s -X DELETE $url/api/sandboxes/abcd1234 -H 'X-API-Key: $PROVISIONER_API_KEY'
  func invoke --target $url --format http --data '{"operation":"list","api_key":"$PROVISIONER_API_KEY"}'

MSG
if [[ "$NODE" == real ]]; then
  cat >&2 <<MSG
  E2B's SDK (docs/e2b.md; its default template, base, carries the agent), ready to paste:

  export E2B_API_URL=$url/e2b
  export E2B_SANDBOX_URL=$e2b_sandbox_url
  export E2B_API_KEY=$PROVISIONER_API_KEY

  curl -s -X POST $url/e2b/sandboxes -H 'X-API-Key: $PROVISIONER_API_KEY' -H 'Content-Type: application/json' -d '{"templateID":"base"}'

MSG
else
  cat >&2 <<MSG
  No E2B here: kwok runs no container, so no sandbox's agent could answer (make run NODE=real serves E2B's SDK).

MSG
fi
if [[ "$NODE" == real ]]; then
  # Not exec: the trap above takes the node down when the function stops.
  # The subshell records the function's pid (exec keeps it) for a later run
  # to end should this one be killed.
  #
  # The function runs as this script's job, and the script hands it the
  # signal that stops the run. make passes SIGTERM to its child alone (this
  # script: `kill <make's pid>`, timeout(1), a supervisor), and a function
  # left behind would keep the address and a cluster whose node is gone.
  # wait returns early (above 128) when a trapped signal arrives, so it
  # waits again until the function has ended, and exits with its status.
  (
    echo "function $BASHPID $(starttime "$BASHPID")" >>"$pidfile"
    exec "$bin"
  ) &
  fn_pid=$!
  trap 'kill -TERM "$fn_pid" 2>/dev/null || true' INT TERM HUP
  rc=0
  while kill -0 "$fn_pid" 2>/dev/null; do
    if wait "$fn_pid"; then rc=0; else rc=$?; fi
  done
  exit "$rc"
else
  exec "$bin"
fi
