#!/usr/bin/env bash
# A private RabbitMQ node on 127.0.0.1 for the queue bridge, its tests and CI.
#
# The node keeps everything (data, logs, Erlang cookie, settings) in one directory and never touches
# /var/lib/rabbitmq or needs systemd, so it runs as root in a container, beside other nodes, and is
# gone with `stop` + `rm -rf DIR`. The Debian package is installed with apt-get when it is missing
# and we are root.
#
#   scripts/rabbitmq.sh install
#   scripts/rabbitmq.sh start  [--dir DIR] [--port 5672] [--node NAME] [--dist-port P] [--epmd-port P]
#   scripts/rabbitmq.sh stop   [--dir DIR]
#   scripts/rabbitmq.sh status [--dir DIR]
#
# `start` prints the AMQP URL (also in DIR/amqp_url). Defaults: DIR=run/rabbitmq in the repository,
# port 5672, node name "embedding", Erlang distribution port = AMQP port + 20000, epmd port 4369;
# a later `start --dir DIR` reuses the settings DIR was first started with.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RMQ_BIN=/usr/lib/rabbitmq/bin

die() { echo "rabbitmq.sh: $*" >&2; exit 1; }
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

cmd=${1:-}
case "$cmd" in
  -h|--help) usage 0 ;;
  "") usage 2 ;;
  install|start|stop|status) shift ;;
  *) echo "rabbitmq.sh: unknown command: $cmd" >&2; usage 2 ;;
esac
DIR=${RABBITMQ_DIR:-$ROOT/run/rabbitmq}
ARG_PORT="" ARG_NODE="" ARG_DIST_PORT="" ARG_EPMD_PORT=""
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || case "$1" in -h|--help) ;; *) die "$1 needs a value" ;; esac
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --port) ARG_PORT=$2; shift 2 ;;
    --node) ARG_NODE=$2; shift 2 ;;
    --dist-port) ARG_DIST_PORT=$2; shift 2 ;;
    --epmd-port) ARG_EPMD_PORT=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done

install_broker() {
  [ -x "$RMQ_BIN/rabbitmq-server" ] && return 0
  [ "$(id -u)" = 0 ] || die "rabbitmq-server is not installed; as root: apt-get install rabbitmq-server"
  echo "rabbitmq.sh: installing the rabbitmq-server package" >&2
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d (containers) or a missing init system keeps the package's own service from starting,
  # and that is what we want: this script runs a private node instead.
  apt-get install -y --no-install-recommends rabbitmq-server >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends rabbitmq-server >/dev/null; } \
    || die "apt-get install rabbitmq-server failed"
  [ -x "$RMQ_BIN/rabbitmq-server" ] || die "rabbitmq-server installed but $RMQ_BIN/rabbitmq-server is missing"
}

if [ "$cmd" = install ]; then
  install_broker
  exit
fi
[ "$cmd" != start ] || mkdir -p "$DIR"
[ -d "$DIR" ] || { echo "rabbitmq.sh: no node in $DIR" >&2; [ "$cmd" = stop ]; exit; }
DIR=$(cd "$DIR" && pwd)
ENV_FILE=$DIR/node.env
# A directory remembers its node's settings: `start --dir DIR` again restarts the same node.
PORT=5672 NODE=embedding DIST_PORT="" EPMD_PORT=4369
if [ -f "$DIR/settings" ]; then
  # shellcheck disable=SC1091
  . "$DIR/settings"
fi
PORT=${ARG_PORT:-$PORT} NODE=${ARG_NODE:-$NODE} EPMD_PORT=${ARG_EPMD_PORT:-$EPMD_PORT}
DIST_PORT=${ARG_DIST_PORT:-$DIST_PORT}
if [ -n "$ARG_PORT" ] && [ -z "$ARG_DIST_PORT" ]; then
  DIST_PORT=""  # follows the new AMQP port
fi


# Every variable the node and rabbitmqctl need, so `stop`/`status` only need --dir.
write_env() {
  [ -n "$DIST_PORT" ] || DIST_PORT=$((PORT + 20000))
  [ "$DIST_PORT" -le 65535 ] || die "--port $PORT + 20000 is not a port: pass --dist-port"
  local host; host=localhost
  printf 'PORT=%s NODE=%s DIST_PORT=%s EPMD_PORT=%s\n' "$PORT" "$NODE" "$DIST_PORT" "$EPMD_PORT" > "$DIR/settings"
  cat > "$ENV_FILE" <<EOF
export HOME='$DIR'
export RABBITMQ_NODENAME='$NODE@$host'
export RABBITMQ_USE_LONGNAME=false
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$PORT
export RABBITMQ_DIST_PORT=$DIST_PORT
export ERL_EPMD_PORT=$EPMD_PORT
export ERL_EPMD_ADDRESS=127.0.0.1
export RABBITMQ_MNESIA_BASE='$DIR/mnesia'
export RABBITMQ_LOG_BASE='$DIR/log'
export RABBITMQ_PID_FILE='$DIR/rabbitmq.pid'
export ERL_CRASH_DUMP='$DIR/erl_crash.dump'
export RABBITMQ_CONFIG_FILE='$DIR/rabbitmq.conf'
export RABBITMQ_ADVANCED_CONFIG_FILE='$DIR/advanced.config'
export RABBITMQ_CONF_ENV_FILE='$DIR/rabbitmq-env.conf'
export RABBITMQ_ENABLED_PLUGINS_FILE='$DIR/enabled_plugins'
export RABBITMQ_PLUGINS_EXPAND_DIR='$DIR/plugins-expand'
# Shared 2-core machines: unbound schedulers that sleep instead of busy-waiting.
export RABBITMQ_SCHEDULER_BIND_TYPE=u
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='+sbwt none +sbwtdcpu none +sbwtdio none'
export AMQP_PORT=$PORT
EOF
  : > "$DIR/rabbitmq-env.conf"
  echo "[]." > "$DIR/enabled_plugins"
  # Erlang distribution (clustering, rabbitmqctl) on loopback only, like AMQP and epmd.
  echo "[{kernel, [{inet_dist_use_interface, {127,0,0,1}}]}]." > "$DIR/advanced.config"
  cat > "$DIR/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$PORT
loopback_users.guest = true
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.2
log.console = false
log.file.level = info
EOF
}

load_env() {
  [ -f "$ENV_FILE" ] || return 1
  # shellcheck disable=SC1090
  . "$ENV_FILE"
}

ctl() { "$RMQ_BIN/rabbitmqctl" -q "$@"; }

node_pid() {
  local pid
  pid=$(cat "$RABBITMQ_PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

url() { echo "amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2F"; }

start() {
  install_broker
  if load_env && node_pid >/dev/null; then
    echo "rabbitmq.sh: node $RABBITMQ_NODENAME already running" >&2
    url
    return 0
  fi
  port_taken "$PORT" && die "port $PORT is already in use on 127.0.0.1 (another broker?): pass --port"
  write_env
  port_taken "$DIST_PORT" && die "Erlang distribution port $DIST_PORT is already in use: pass --dist-port"
  load_env
  mkdir -p "$RABBITMQ_MNESIA_BASE" "$RABBITMQ_LOG_BASE"
  rm -f "$RABBITMQ_PID_FILE"
  "$RMQ_BIN/rabbitmq-server" -detached >"$DIR/startup.log" 2>&1 || die "rabbitmq-server failed: $(tail -5 "$DIR/startup.log")"
  local began=$SECONDS
  until ctl await_startup --timeout 5 >/dev/null 2>&1; do
    # The pid file appears early in the boot; without a live pid after 15 s the node has died.
    if [ $((SECONDS - began)) -ge 90 ] || { [ $((SECONDS - began)) -ge 15 ] && ! node_pid >/dev/null; }; then
      stop_node >/dev/null 2>&1 || true
      die "node did not start; see $RABBITMQ_LOG_BASE/, or run it in the foreground to see why:
  (. $ENV_FILE && $RMQ_BIN/rabbitmq-server)
$(tail -20 "$RABBITMQ_LOG_BASE/$RABBITMQ_NODENAME.log" 2>/dev/null; tail -5 "$DIR/startup.log")"
    fi
    sleep 0.5
  done
  echo "rabbitmq.sh: node $RABBITMQ_NODENAME ready on 127.0.0.1:$PORT (data in $DIR)" >&2
  url | tee "$DIR/amqp_url"
}

stop_node() {
  local pid
  if ! pid=$(node_pid); then
    echo "rabbitmq.sh: node not running" >&2
  else
    ctl stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "rabbitmq.sh: node $RABBITMQ_NODENAME stopped" >&2
  fi
  rm -f "$RABBITMQ_PID_FILE"
  # A private epmd (not the shared default one) was started for this node alone.
  if [ "$ERL_EPMD_PORT" != 4369 ]; then
    epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
  fi
}

case "$cmd" in
  start) start ;;
  stop)
    load_env || { echo "rabbitmq.sh: no node in $DIR" >&2; exit 0; }
    stop_node ;;
  status)
    load_env || die "no node in $DIR"
    node_pid >/dev/null || die "node $RABBITMQ_NODENAME is not running"
    echo "node $RABBITMQ_NODENAME running (pid $(node_pid)), $(url)"
    ctl list_queues name type messages_ready messages_unacknowledged consumers ;;
esac
