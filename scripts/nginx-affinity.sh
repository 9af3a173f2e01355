#!/usr/bin/env bash
# nginx (Debian's package) in front of several `attic serve` instances, as docs/serving.md
# "Several servers behind nginx" describes: one unprivileged nginx of its own (its own
# prefix, configuration, pid file, logs and temporary files, all in a state directory; no
# system configuration is read or touched), listening on a loopback port and routing each
# request to an instance by its X-Session-Id header (consistent hashing: a conversation
# stays on one instance), or round-robin, or at random. Installs nginx when it is missing.
#
# Usage:
#   scripts/nginx-affinity.sh start  PORT UPSTREAMS [--routing affinity|round-robin|random]
#                                   [--random] [--round-robin]
#                                   start nginx on 127.0.0.1:PORT in front of UPSTREAMS
#                                   (host:port,host:port,...; the `attic serve` instances),
#                                   wait until it answers; --random / --round-robin are
#                                   short for --routing random / round-robin (default
#                                   affinity). An nginx the same state directory still
#                                   holds (a killed run) is stopped first
#   scripts/nginx-affinity.sh config PORT UPSTREAMS [...]   print the configuration start writes
#   scripts/nginx-affinity.sh stop   PORT   stop the nginx this state directory started
#   scripts/nginx-affinity.sh status PORT   whether it runs (its pid); exit 1 if not
#   scripts/nginx-affinity.sh install       install nginx if missing; exit 1 if it cannot be
#
# Environment:
#   NGINX_AFFINITY_DIR           state directory (default ${TMPDIR:-/tmp}/attic-nginx-PORT):
#                                nginx.conf, nginx.pid, error.log, access.log (one line a
#                                request: its X-Session-Id and the upstream that served it),
#                                tmp/. Removed by stop.
#   NGINX_AFFINITY_FAIL_TIMEOUT  seconds an instance that refused a connection is left out
#                                (nginx `max_fails=1 fail_timeout=...`; default 10)
#   NGINX_AFFINITY_READ_TIMEOUT  seconds nginx waits on an instance's answer (default 600:
#                                a long prefill streams nothing until its first token)
#
# Started by root, nginx runs its workers as `nobody` as usual (its master stays root to
# do so); started by any other user, everything runs as that user.
#
# Contract: `stop` kills only the pid this state directory's pid file names, and only
# while that pid is an nginx process started with this state directory's configuration.
# `start` refuses a taken port, and a failed start stops what it started.
set -euo pipefail

cmd=${1:-}
port=${2:-}
dir_for() { echo "${NGINX_AFFINITY_DIR:-${TMPDIR:-/tmp}/attic-nginx-$1}"; }
fail_timeout=${NGINX_AFFINITY_FAIL_TIMEOUT:-10}
read_timeout=${NGINX_AFFINITY_READ_TIMEOUT:-600}

usage() {
  echo "usage: $0 start|config PORT HOST:PORT[,HOST:PORT...] [--routing affinity|round-robin|random]" >&2
  echo "       $0 stop|status PORT" >&2
  echo "       $0 install" >&2
  exit 2
}

nginx_bin() {  # Debian installs it in /usr/sbin, which a user's PATH may lack
  command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; } || return 1
}

install_nginx() {
  nginx_bin >/dev/null && return 0
  echo "nginx-affinity: installing nginx" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "nginx-affinity: nginx is missing and sudo is not available" >&2; return 1; }
    sudo="sudo -n"
  fi
  { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nginx; } \
    || { echo "nginx-affinity: could not install nginx" >&2; return 1; }
  nginx_bin >/dev/null
}

check_port() {
  case "$1" in
    ''|*[!0-9]*) echo "nginx-affinity: port must be a number, got '$1'" >&2; exit 2 ;;
  esac
  if [ "$1" -lt 1024 ] || [ "$1" -gt 65535 ]; then
    echo "nginx-affinity: port $1 out of range (1024..65535: nginx runs unprivileged)" >&2
    exit 2
  fi
}

port_taken() {  # whether something listens on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether pid $1 is an nginx master started with configuration file $2 (so a recycled
# pid, or someone else's nginx, is never killed).
is_ours() {
  [ -r "/proc/$1/cmdline" ] || return 1
  local argv
  argv=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null) || return 1
  case "$argv" in
    nginx:\ master\ process*"$2"*|*nginx\ *-c\ "$2"*) return 0 ;;
  esac
  return 1
}

stop_nginx() {  # $1: state directory
  local d=$1 pid
  [ -f "$d/nginx.pid" ] || return 0
  pid=$(cat "$d/nginx.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && is_ours "$pid" "$d/nginx.conf"; then
    kill -TERM "$pid" 2>/dev/null || true  # fast shutdown: open streams are cut
    for _ in $(seq 50); do is_ours "$pid" "$d/nginx.conf" || break; sleep 0.1; done
    if is_ours "$pid" "$d/nginx.conf"; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$d/nginx.pid"
}

# The configuration for listening port $1, upstreams $2 (comma-separated), routing $3,
# state directory $4.
write_config() {
  local listen=$1 ups=$2 routing=$3 d=$4 balance u
  case "$routing" in
    affinity) balance="hash \$http_x_session_id consistent;  # a conversation stays on one instance" ;;
    round-robin) balance="# round-robin (nginx's default)" ;;
    random) balance="random;" ;;
    *) echo "nginx-affinity: --routing must be affinity, round-robin or random, got '$routing'" >&2; exit 2 ;;
  esac
  cat <<EOF
# Written by scripts/nginx-affinity.sh: nginx in front of $(echo "$ups" | tr ',' ' ')
# routing $routing. Everything it writes is under $d.
daemon on;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log notice;
events { worker_connections 1024; }
http {
  log_format attic '\$time_iso8601 "\$request" \$status session=\$http_x_session_id '
                   'upstream=\$upstream_addr upstream_status=\$upstream_status \$request_time';
  access_log $d/access.log attic;
  client_body_temp_path $d/tmp/client_body;
  proxy_temp_path $d/tmp/proxy;
  fastcgi_temp_path $d/tmp/fastcgi;
  uwsgi_temp_path $d/tmp/uwsgi;
  scgi_temp_path $d/tmp/scgi;

  upstream attic {
    $balance
EOF
  for u in $(echo "$ups" | tr ',' ' '); do
    echo "    server $u max_fails=1 fail_timeout=${fail_timeout}s;"
  done
  cat <<EOF
    keepalive 16;
  }
  server {
    listen 127.0.0.1:$listen;
    client_max_body_size 0;             # attic serve's --max-body is the limit
    # Request bodies up to attic serve's default --max-body stay in memory, never in a
    # temporary file: started as root, nginx's workers run as nobody and may not reach
    # a state directory under a private parent.
    client_body_buffer_size 8m;
    location / {
      proxy_pass http://attic;
      proxy_http_version 1.1;
      proxy_set_header Connection "";   # keep-alive to the instances
      proxy_buffering off;              # server-sent events go out as they come
      proxy_connect_timeout 2s;
      proxy_read_timeout ${read_timeout}s;
      proxy_send_timeout ${read_timeout}s;
      # An instance that is down (connection refused, or no answer within the connect
      # timeout) is skipped: the request goes to the next instance on the hash ring,
      # which finds the conversation in the shared KV tier (--kv-remote).
      proxy_next_upstream error timeout;
    }
  }
}
EOF
}

case "$cmd" in
  install)
    install_nginx
    echo "nginx-affinity: $(nginx_bin)"
    ;;
  start|config)
    [ $# -ge 3 ] || usage
    check_port "$port"
    ups=$3
    shift 3
    routing=affinity
    while [ $# -gt 0 ]; do
      case "$1" in
        --routing) [ $# -ge 2 ] || usage; routing=$2; shift 2 ;;
        --routing=*) routing=${1#--routing=}; shift ;;
        --random) routing=random; shift ;;
        --round-robin) routing=round-robin; shift ;;
        --affinity) routing=affinity; shift ;;
        *) usage ;;
      esac
    done
    for u in $(echo "$ups" | tr ',' ' '); do
      case "$u" in
        *:*[0-9]) ;;
        *) echo "nginx-affinity: upstream '$u' is not host:port" >&2; exit 2 ;;
      esac
    done
    dir=$(dir_for "$port")
    if [ "$cmd" = config ]; then
      write_config "$port" "$ups" "$routing" "$dir"
      exit 0
    fi
    install_nginx
    bin=$(nginx_bin)
    if [ -d "$dir" ]; then  # an nginx of this state directory left running (a killed run): ours
      echo "nginx-affinity: stopping the nginx left in $dir first" >&2
      stop_nginx "$dir"
      rm -rf "$dir"
    fi
    if port_taken "$port"; then
      echo "nginx-affinity: port $port is taken: choose another" >&2
      exit 1
    fi
    mkdir -p "$dir/tmp"
    chmod 755 "$dir"
    write_config "$port" "$ups" "$routing" "$dir" > "$dir/nginx.conf"
    trap 'stop_nginx "$dir"; rm -rf "$dir"' ERR
    # -p: its own prefix, -e: the error log before the configuration is read (never the
    # package's /var/log/nginx), -c: this configuration only.
    "$bin" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" -t -q
    "$bin" -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf"
    up=0
    for _ in $(seq 100); do
      if [ -s "$dir/nginx.pid" ] && port_taken "$port"; then up=1; break; fi
      sleep 0.1
    done
    if [ $up -ne 1 ]; then
      echo "nginx-affinity: nginx did not start ($dir/error.log):" >&2
      tail -5 "$dir/error.log" >&2 || true
      false
    fi
    trap - ERR
    echo "nginx-affinity: 127.0.0.1:$port -> $ups ($routing; pid $(cat "$dir/nginx.pid"), $dir)"
    ;;
  stop)
    check_port "$port"
    dir=$(dir_for "$port")
    if [ -d "$dir" ]; then
      stop_nginx "$dir"
      rm -rf "$dir"
    fi
    ;;
  status)
    check_port "$port"
    dir=$(dir_for "$port")
    pid=$(cat "$dir/nginx.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && is_ours "$pid" "$dir/nginx.conf"; then
      echo "nginx-affinity: running on 127.0.0.1:$port (pid $pid, $dir)"
      exit 0
    fi
    echo "nginx-affinity: not running ($dir)" >&2
    exit 1
    ;;
  *)
    usage
    ;;
esac
