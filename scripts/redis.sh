#!/usr/bin/env bash
# Install and start the Redis server the test suite uses (127.0.0.1:6379, no systemd).
#
# usage: scripts/redis.sh [install|start|stop|status|all]   (default: all)
#
#   install    apt-get install redis-server (apt-get update only when needed)
#   start      start a daemonized redis-server on 127.0.0.1:6379 without persistence unless one
#              already answers; wait (bounded) until `redis-cli ping` answers PONG
#   stop       shut the server down without saving (whoever started it)
#   status     say whether the server answers
#   all        install + start
#
# Environment: CKIT_REDIS_TIMEOUT (seconds to wait for start/stop, default 60).
set -euo pipefail

readonly HOST=127.0.0.1
readonly PORT=6379
readonly TIMEOUT=${CKIT_REDIS_TIMEOUT:-60}
readonly LOGFILE=/var/log/ckit-redis.log
readonly PIDFILE=/run/ckit-redis.pid
readonly WORKDIR=/var/lib/ckit-redis

LOG_TAG=redis
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }

alive() { [[ $(timeout 3 redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null) == PONG ]]; }
gone() { ! alive; }

cmd_install() {
  need_root
  apt_install redis-server
}

cmd_start() {
  command -v redis-server >/dev/null || die "redis-server is not installed: run $0 install"
  if alive; then
    # A server started by the package's own init script persists to disk and refuses writes
    # when a background save fails; the tests want neither.
    if ! { cli config set save '' && cli config set appendonly no; } >/dev/null; then
      die "a server answers on ${HOST}:${PORT} but CONFIG SET failed"
    fi
    log "already running"
    return 0
  fi
  install -d -m 0755 "$WORKDIR"
  : >>"$LOGFILE"
  # --daemonize forks into its own session and drops the inherited descriptors; they are
  # redirected anyway so nothing keeps the caller's output open (errors go to --logfile).
  if ! redis-server --bind "$HOST" --port "$PORT" --daemonize yes --save '' --appendonly no \
    --dir "$WORKDIR" --logfile "$LOGFILE" --pidfile "$PIDFILE" </dev/null >/dev/null 2>&1; then
    tail -n 40 "$LOGFILE" >&2
    die "redis-server failed to launch"
  fi
  if ! wait_until "a PONG" "+${TIMEOUT}" alive; then
    log "last lines of $LOGFILE:"
    tail -n 40 "$LOGFILE" >&2
    die "Redis did not start"
  fi
  log "started on ${HOST}:${PORT}"
}

cmd_stop() {
  if ! alive; then
    log "not running"
    return 0
  fi
  cli shutdown nosave >/dev/null 2>&1 || true  # the connection drops as the server exits
  if ! wait_until "the server to stop" "+${TIMEOUT}" gone; then
    tail -n 40 "$LOGFILE" >&2 || true
    die "server still answers ${TIMEOUT}s after SHUTDOWN"
  fi
  log "stopped"
}

cmd_status() {
  if ! command -v redis-server >/dev/null; then
    log "not installed"
    return 3
  fi
  if alive; then
    log "running: redis $(cli info server | sed -n 's/^redis_version:\(.*\)\r$/\1/p'), ${HOST}:${PORT}"
  else
    log "not running"
    return 3
  fi
}

main() {
  local cmd=${1:-all}
  case $cmd in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    all) cmd_install; cmd_start ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
