#!/usr/bin/env bash
# A private Prometheus on 127.0.0.1 scraping the local TorchServe, with the project's rules and alerts.
#
# Data, log and pid file live in one directory (default run/prometheus, ignored by git); nothing touches
# /var/lib/prometheus or Debian's own prometheus service. The Debian package (2.x, with promtool) is
# installed when missing and we are root; its system service is kept from starting and disabled, so it
# never holds port 9090 behind our back.
#
#   scripts/prometheus.sh install
#   scripts/prometheus.sh start  [--dir DIR] [--port 9091] [--config FILE] [--retention 7d]
#   scripts/prometheus.sh stop   [--dir DIR]
#   scripts/prometheus.sh status [--dir DIR]
#
# `start` checks the config with promtool, waits until Prometheus is ready and prints its URL (also in
# DIR/url). Defaults: DIR=run/prometheus ($PROMETHEUS_DIR), port 9091 ($PROMETHEUS_PORT),
# config deploy/prometheus/prometheus.yml (scrapes TorchServe's metrics on 127.0.0.1:8082).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "prometheus.sh: $*" >&2; exit 1; }
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

cmd=${1:-}
case "$cmd" in
  -h|--help) usage 0 ;;
  "") usage 2 ;;
  install|start|stop|status) shift ;;
  *) echo "prometheus.sh: unknown command: $cmd" >&2; usage 2 ;;
esac
DIR=${PROMETHEUS_DIR:-$ROOT/run/prometheus}
PORT=${PROMETHEUS_PORT:-9091}
CONFIG=$ROOT/deploy/prometheus/prometheus.yml
RETENTION=7d
while [ $# -gt 0 ]; do
  case "$1" in -h|--help) usage 0 ;; esac
  [ $# -ge 2 ] || die "$1 needs a value"
  case "$1" in
    --dir) DIR=$2 ;;
    --port) PORT=$2 ;;
    --config) CONFIG=$2 ;;
    --retention) RETENTION=$2 ;;
    *) die "unknown argument: $1" ;;
  esac
  shift 2
done

install_prometheus() {
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "prometheus is not installed; as root: apt-get install prometheus"
  echo "prometheus.sh: installing the prometheus package" >&2
  export DEBIAN_FRONTEND=noninteractive
  # The package starts its own service on :9090 at install; a policy-rc.d that answers 101 stops that
  # (containers usually have one already), and the unit is disabled afterwards.
  local policy=/usr/sbin/policy-rc.d ours=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && ours=1
  fi
  local rc=0
  { apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; } || rc=$?
  [ -z "$ours" ] || rm -f "$policy"
  [ "$rc" = 0 ] || die "apt-get install prometheus failed"
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || systemctl disable prometheus >/dev/null 2>&1 || true
  fi
  command -v promtool >/dev/null 2>&1 || die "prometheus installed but promtool is missing"
}

if [ "$cmd" = install ]; then
  install_prometheus
  exit
fi

PID_FILE=$DIR/prometheus.pid

running_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # a recycled pid is not ours
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "prometheus.*--storage.tsdb.path=$DIR/data" || return 1
  echo "$pid"
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  install_prometheus
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  PID_FILE=$DIR/prometheus.pid
  if pid=$(running_pid); then
    echo "prometheus.sh: already running (pid $pid)" >&2
    cat "$DIR/url"
    return 0
  fi
  [ -f "$CONFIG" ] || die "$CONFIG: no such config"
  CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")
  local check
  check=$(promtool check config "$CONFIG" 2>&1) || die "invalid config $CONFIG: $(echo "$check" | grep -m1 -i 'fail\|error')"
  port_taken "$PORT" && die "port $PORT is already in use on 127.0.0.1: pass --port"
  mkdir -p "$DIR/data"
  # setsid: the server outlives this shell and its terminal; stopped by pid (`stop`).
  setsid prometheus --config.file="$CONFIG" --storage.tsdb.path="$DIR/data" \
    --storage.tsdb.retention.time="$RETENTION" --web.listen-address="127.0.0.1:$PORT" \
    > "$DIR/prometheus.log" 2>&1 < /dev/null &
  echo $! > "$PID_FILE"
  local url=http://127.0.0.1:$PORT began=$SECONDS
  until curl -fsS -o /dev/null --max-time 2 "$url/-/ready" 2>/dev/null; do
    if ! running_pid >/dev/null; then
      die "prometheus exited: $(grep -m1 -i 'err' "$DIR/prometheus.log" || tail -3 "$DIR/prometheus.log")"
    fi
    if [ $((SECONDS - began)) -ge 60 ]; then
      stop_server >/dev/null 2>&1 || true
      die "not ready after 60 s; see $DIR/prometheus.log"
    fi
    sleep 0.2
  done
  echo "$url" > "$DIR/url"
  echo "prometheus.sh: ready on $url (config $CONFIG, data in $DIR)" >&2
  echo "$url"
}

stop_server() {
  local pid
  if ! pid=$(running_pid); then
    echo "prometheus.sh: not running" >&2
    rm -f "$PID_FILE"
    return 0
  fi
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$PID_FILE"
  echo "prometheus.sh: stopped (pid $pid)" >&2
}

if [ "$cmd" != start ]; then
  [ -d "$DIR" ] || { echo "prometheus.sh: nothing in $DIR" >&2; [ "$cmd" = stop ]; exit; }
  DIR=$(cd "$DIR" && pwd)
  PID_FILE=$DIR/prometheus.pid
fi
case "$cmd" in
  start) start ;;
  stop) stop_server ;;
  status)
    pid=$(running_pid) || die "not running (dir $DIR)"
    echo "prometheus running (pid $pid) on $(cat "$DIR/url")"
    curl -fsS --max-time 5 "$(cat "$DIR/url")/api/v1/targets?state=active" \
      | python3 -c 'import json,sys; t=json.load(sys.stdin)["data"]["activeTargets"]; [print(x["scrapeUrl"], x["health"], x["lastError"]) for x in t] or print("(no target discovered yet)")' ;;
esac
