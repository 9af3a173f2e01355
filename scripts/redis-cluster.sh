#!/usr/bin/env bash
# A real Redis 7 Cluster on loopback for Attic's remote KV tier (docs/store.md "Remote
# tier"): 3 masters + 3 replicas, each a `redis-server --cluster-enabled yes` process, in
# a state directory of its own. Installs Debian's redis-server when it is missing.
#
# Usage:
#   scripts/redis-cluster.sh start   [BASE]   start nodes on ports BASE..BASE+5 (cluster bus:
#                                             +10000), create the cluster, wait for
#                                             cluster_state:ok; prints the seed nodes. A
#                                             cluster the same state directory still holds
#                                             (a killed run) is stopped first
#   scripts/redis-cluster.sh stop    [BASE]   stop every node this state directory started
#   scripts/redis-cluster.sh restart [BASE]   stop, then start the same nodes again with their
#                                             cluster configuration (same cluster, empty: no
#                                             persistence)
#   scripts/redis-cluster.sh down    [BASE]   stop the nodes but keep their state directory (a
#                                             cluster that went away; `up` brings it back)
#   scripts/redis-cluster.sh up      [BASE]   start the nodes of a `down` cluster again
#   scripts/redis-cluster.sh status  [BASE]   CLUSTER INFO of the first live node; exit 1 if none
#   scripts/redis-cluster.sh nodes   [BASE]   the nodes as host:port,host:port,... (for --kv-remote)
#
# Environment:
#   REDIS_CLUSTER_PORT       BASE when it is not given (default 7000)
#   REDIS_CLUSTER_DIR        state directory (default ${TMPDIR:-/tmp}/attic-redis-cluster-BASE):
#                            per node its config, pid file, log and cluster config file,
#                            and `nodes` (the seed list). Removed by stop.
#   REDIS_CLUSTER_MAXMEMORY  maxmemory of each node (default 256mb), policy allkeys-lru:
#                            the remote tier evicts by itself (docs/store.md)
#   REDIS_CLUSTER_TIMEOUT    seconds to wait for cluster_state:ok (default 60)
#
# Contract: `stop` kills only the processes whose pids this state directory recorded and
# that still are redis-server processes on its ports; `start` that fails stops what it
# started before it exits. It refuses to start when a node's port or bus port is taken.
set -euo pipefail

cmd=${1:-}
base=${2:-${REDIS_CLUSTER_PORT:-7000}}
case "$base" in
  ''|*[!0-9]*) echo "redis-cluster: port base must be a number, got '$base'" >&2; exit 2 ;;
esac
if [ "$base" -lt 1024 ] || [ "$base" -gt 55530 ]; then
  echo "redis-cluster: port base $base out of range (1024..55530: bus ports are +10000)" >&2
  exit 2
fi
dir=${REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/attic-redis-cluster-$base}
maxmemory=${REDIS_CLUSTER_MAXMEMORY:-256mb}
timeout=${REDIS_CLUSTER_TIMEOUT:-60}
ports=()
for i in 0 1 2 3 4 5; do ports+=($((base + i))); done

install_redis() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
  echo "redis-cluster: installing redis-server" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools
}

port_taken() {  # whether something listens on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether pid $1 is a redis-server (so a recycled pid is never killed).
is_redis() {
  [ -r "/proc/$1/comm" ] && [ "$(cat "/proc/$1/comm")" = "redis-server" ]
}

stop_nodes() {
  local p pid
  for p in "${ports[@]}"; do
    [ -f "$dir/$p/redis.pid" ] || continue
    pid=$(cat "$dir/$p/redis.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && is_redis "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  # Wait for them to go (a node that will not: KILL after 5 s).
  for p in "${ports[@]}"; do
    [ -f "$dir/$p/redis.pid" ] || continue
    pid=$(cat "$dir/$p/redis.pid" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    for _ in $(seq 50); do is_redis "$pid" || break; sleep 0.1; done
    if is_redis "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$dir/$p/redis.pid"
  done
}

# Starts the six processes (their cluster config files are kept across restarts).
start_nodes() {
  local p
  for p in "${ports[@]}"; do
    if port_taken "$p" || port_taken $((p + 10000)); then
      echo "redis-cluster: port $p or $((p + 10000)) is taken: choose another base" >&2
      return 1
    fi
  done
  for p in "${ports[@]}"; do
    mkdir -p "$dir/$p"
    cat > "$dir/$p/redis.conf" <<EOF
port $p
bind 127.0.0.1
cluster-enabled yes
cluster-config-file $dir/$p/nodes.conf
cluster-node-timeout 2000
cluster-require-full-coverage no
dir $dir/$p
pidfile $dir/$p/redis.pid
logfile $dir/$p/redis.log
daemonize yes
save ""
appendonly no
maxmemory $maxmemory
maxmemory-policy allkeys-lru
enable-debug-command local
EOF
    redis-server "$dir/$p/redis.conf"
  done
  for p in "${ports[@]}"; do
    for _ in $(seq 100); do
      redis-cli -p "$p" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    redis-cli -p "$p" ping >/dev/null 2>&1 || { echo "redis-cluster: node $p did not start ($dir/$p/redis.log)" >&2; return 1; }
  done
}

wait_ok() {
  local p deadline=$((SECONDS + timeout))
  while [ $SECONDS -lt $deadline ]; do
    local all=1
    for p in "${ports[@]}"; do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { all=0; break; }
    done
    if [ $all -eq 1 ]; then return 0; fi
    sleep 0.2
  done
  echo "redis-cluster: no cluster_state:ok within ${timeout}s" >&2
  return 1
}

seed_list() {
  local out="" p
  for p in "${ports[@]}"; do out+="${out:+,}127.0.0.1:$p"; done
  echo "$out"
}

case "$cmd" in
  start)
    install_redis
    if [ -d "$dir" ]; then  # a cluster of this state directory left running (a killed run): ours
      echo "redis-cluster: stopping the cluster left in $dir first" >&2
      stop_nodes
      rm -rf "$dir"
    fi
    mkdir -p "$dir"
    trap 'stop_nodes; rm -rf "$dir"' ERR
    start_nodes
    args=()
    for p in "${ports[@]}"; do args+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${args[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
      cat "$dir/create.log" >&2; false; }
    wait_ok
    trap - ERR
    seed_list > "$dir/nodes"
    echo "redis-cluster: 3 masters + 3 replicas on 127.0.0.1:${ports[0]}-${ports[5]} ($dir)"
    seed_list
    ;;
  restart|down|up)
    [ -d "$dir" ] || { echo "redis-cluster: no cluster in $dir" >&2; exit 1; }
    if [ "$cmd" != up ]; then stop_nodes; fi
    if [ "$cmd" != down ]; then
      trap 'stop_nodes' ERR
      start_nodes
      wait_ok
      trap - ERR
      echo "redis-cluster: running again on 127.0.0.1:${ports[0]}-${ports[5]}"
    fi
    ;;
  stop)
    if [ -d "$dir" ]; then
      stop_nodes
      rm -rf "$dir"
    fi
    ;;
  status)
    for p in "${ports[@]}"; do
      if redis-cli -p "$p" cluster info 2>/dev/null | grep '^cluster_'; then exit 0; fi
    done
    echo "redis-cluster: no node answers on 127.0.0.1:${ports[0]}-${ports[5]}" >&2
    exit 1
    ;;
  nodes)
    seed_list
    ;;
  *)
    echo "usage: $0 start|stop|restart|down|up|status|nodes [PORT_BASE]" >&2
    exit 2
    ;;
esac
