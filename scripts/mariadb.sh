#!/usr/bin/env bash
# Install, start and provision the MariaDB server the test suite uses (loopback only, no systemd).
#
# usage: scripts/mariadb.sh [install|start|provision|stop|status|all]   (default: all)
#
#   install    apt-get install mariadb-server mariadb-client (apt-get update only when needed)
#              and write /etc/mysql/mariadb.conf.d/99-ckit.cnf and 99-ckit-binlog.cnf (the
#              binary log the replica of scripts/mariadb-replica.sh follows: server id 1, ROW
#              format, only database ckit_replica logged, so the other databases pay nothing;
#              a running server is restarted for 99-ckit.cnf changes, never for this file alone:
#              it takes effect at the next start)
#   start      start the server unless it already answers; wait (bounded) for `mariadb-admin ping`
#   provision  databases ckit_test, ckit_test2, ckit_bench, ckit_shard1..3 (the sharded-outbox
#              tests), ckit_replica (the replica tests); user ckit/ckit on 127.0.0.1 and
#              localhost with all privileges on `ckit%` databases (idempotent)
#   stop       shut the server down (whoever started it)
#   status     say whether the server answers, on the socket and on 127.0.0.1:3306
#   all        install + start + provision
#
# Environment: CKIT_MARIADB_TIMEOUT (seconds to wait for start/stop, default 60);
#   CKIT_MARIADB_NO_SERVICE=1 skips `service mariadb start` and launches mysqld_safe directly.
set -euo pipefail

readonly PORT=3306
readonly DATADIR=/var/lib/mysql
readonly RUNDIR=/run/mysqld
readonly LOGDIR=/var/log/mysql
readonly ERRLOG=${LOGDIR}/error.log
readonly LAUNCH_LOG=${LOGDIR}/ckit-launch.log
readonly CONF=/etc/mysql/mariadb.conf.d/99-ckit.cnf
readonly BINLOG_CONF=/etc/mysql/mariadb.conf.d/99-ckit-binlog.cnf
readonly TIMEOUT=${CKIT_MARIADB_TIMEOUT:-60}
readonly DATABASES=(ckit_test ckit_test2 ckit_bench ckit_shard1 ckit_shard2 ckit_shard3 ckit_replica)

LOG_TAG=mariadb
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

write_conf() {
  local tmp
  mkdir -p "$(dirname "$CONF")"
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Written by consumer-kit scripts/mariadb.sh: a small test server on loopback only.
# Transaction isolation is deliberately left at the default REPEATABLE-READ.
[mysqld]
bind-address            = 127.0.0.1
port                    = ${PORT}
skip-name-resolve
innodb_buffer_pool_size = 256M
max_connections         = 300
log_error               = ${ERRLOG}

[mysqld_safe]
skip_syslog
log_error               = ${ERRLOG}
EOF
  if cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
    return 1  # unchanged
  fi
  install -m 0644 "$tmp" "$CONF"
  rm -f "$tmp"
  log "wrote $CONF"
  return 0
}

# The binary log for the replica tests. binlog_do_db keeps every other database out of it (ROW
# format: a change is logged by the database of its table), so the shared server writes no binlog
# for ckit_test, ckit_bench and the others; log_bin_trust_function_creators lets user ckit create
# triggers as it could without a binary log.
write_binlog_conf() {
  local tmp
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Written by consumer-kit scripts/mariadb.sh: the binary log scripts/mariadb-replica.sh replicates.
[mysqld]
server_id                       = 1
log_bin                         = ckit-bin
binlog_format                   = ROW
binlog_do_db                    = ckit_replica
log_bin_trust_function_creators = 1
binlog_expire_logs_seconds      = 86400
max_binlog_size                 = 64M
EOF
  if cmp -s "$tmp" "$BINLOG_CONF"; then
    rm -f "$tmp"
    return 0
  fi
  install -m 0644 "$tmp" "$BINLOG_CONF"
  rm -f "$tmp"
  log "wrote $BINLOG_CONF (takes effect at the server's next start)"
}

cmd_install() {
  need_root
  local changed=0
  # The conf goes in before the packages so a server started by their postinst already uses it.
  write_conf && changed=1
  write_binlog_conf
  apt_install mariadb-server mariadb-client
  # Settings changed while a server is up: restart it so they take effect.
  if ((changed)) && alive; then
    log "configuration changed; restarting the running server"
    cmd_stop
    cmd_start
  fi
}

# True when a server answers on the local socket (mariadb-admin ping exits 0 even on auth errors).
alive() {
  mariadb-admin --no-defaults --protocol=socket --socket="${RUNDIR}/mysqld.sock" \
    --connect-timeout=2 ping >/dev/null 2>&1
}

# True when 127.0.0.1:PORT accepts TCP connections (a ping over TCP as an unknown user fails with
# "host not allowed" before provisioning, so this only checks that the port listens).
alive_tcp() { port_open "$PORT"; }

answers() { alive && alive_tcp; }

# server_gone PID: no server answers and PID (when not empty) has exited.
server_gone() {
  ! alive && { [[ -z $1 ]] || ! kill -0 "$1" 2>/dev/null; }
}

server_pid() {
  local pidfile=${RUNDIR}/mysqld.pid
  [[ -s $pidfile ]] && cat "$pidfile"
}

show_logs() {
  local f
  for f in "$ERRLOG" "$LAUNCH_LOG"; do
    [[ -s $f ]] || continue
    log "--- last lines of $f ---"
    tail -n 40 "$f" >&2
  done
}

wait_until_alive() {
  wait_until "the server to answer" "+${TIMEOUT}" answers || { show_logs; return 1; }
}

prepare_dirs() {
  install -d -o mysql -g mysql -m 0755 "$RUNDIR"
  install -d -o mysql -g adm -m 2750 "$LOGDIR"
  touch "$ERRLOG" "$LAUNCH_LOG"
  chown mysql:adm "$ERRLOG" "$LAUNCH_LOG"
  if [[ ! -d ${DATADIR}/mysql ]]; then
    log "initialising the data directory ${DATADIR}"
    install -d -o mysql -g mysql -m 0755 "$DATADIR"
    mariadb-install-db --user=mysql --datadir="$DATADIR" --skip-test-db \
      --auth-root-authentication-method=socket >>"$LAUNCH_LOG" 2>&1 \
      || { show_logs; die "mariadb-install-db failed"; }
  fi
}

cmd_start() {
  need_root
  command -v mariadb-admin >/dev/null || die "mariadb is not installed: run $0 install"
  if alive; then
    alive_tcp || die "a server is running but does not listen on 127.0.0.1:${PORT}"
    log "already running"
    return 0
  fi
  prepare_dirs
  # Every daemon gets its own session and no inherited descriptors, so nothing started here keeps
  # the caller's stdout open (a CI runner waiting for EOF would hang).
  if [[ -z ${CKIT_MARIADB_NO_SERVICE:-} ]] && command -v service >/dev/null \
    && [[ -x /etc/init.d/mariadb ]]; then
    log "starting with 'service mariadb start'"
    if timeout $((TIMEOUT + 30)) setsid service mariadb start \
      </dev/null >>"$LAUNCH_LOG" 2>&1 && wait_until_alive; then
      log "started (pid $(server_pid || echo '?'))"
      return 0
    fi
    log "'service mariadb start' did not bring the server up; launching mysqld_safe directly"
  fi
  if ! alive; then
    setsid mysqld_safe --datadir="$DATADIR" --bind-address=127.0.0.1 --port="$PORT" \
      </dev/null >>"$LAUNCH_LOG" 2>&1 &
  fi
  wait_until_alive || die "MariaDB did not start"
  log "started (pid $(server_pid || echo '?'))"
}

root_sql() {
  mariadb --no-defaults --protocol=socket --socket="${RUNDIR}/mysqld.sock" -uroot \
    --batch --skip-column-names "$@"
}

cmd_provision() {
  need_root
  alive || die "server is not running: run $0 start"
  local sql="" db host
  for db in "${DATABASES[@]}"; do
    sql+="CREATE DATABASE IF NOT EXISTS \`${db}\` CHARACTER SET utf8mb4;"$'\n'
  done
  for host in 127.0.0.1 localhost; do
    sql+="CREATE USER IF NOT EXISTS 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
    sql+="ALTER USER 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
    sql+="GRANT ALL PRIVILEGES ON \`ckit%\`.* TO 'ckit'@'${host}';"$'\n'
  done
  # SQL goes through stdin so the (fixed, test-only) password never shows in a process list.
  root_sql <<<"$sql" || die "provisioning failed"
  mariadb --no-defaults -uckit -pckit -h127.0.0.1 -P"$PORT" ckit_test -e 'SELECT 1' >/dev/null \
    || die "user ckit cannot log in over TCP after provisioning"
  log "provisioned ${DATABASES[*]} and user ckit@127.0.0.1/localhost"
}

cmd_stop() {
  need_root
  if ! alive; then
    log "not running"
    return 0
  fi
  local pid
  pid=$(server_pid || true)
  mariadb-admin --no-defaults --protocol=socket --socket="${RUNDIR}/mysqld.sock" -uroot \
    shutdown || die "mariadb-admin shutdown failed"
  if ! wait_until "the server to stop" "+${TIMEOUT}" server_gone "$pid"; then
    show_logs
    die "server still running ${TIMEOUT}s after shutdown"
  fi
  log "stopped"
}

cmd_status() {
  if ! command -v mariadb-admin >/dev/null; then
    log "not installed"
    return 3
  fi
  if alive; then
    local version
    version=$(root_sql -e 'SELECT VERSION()' 2>/dev/null || echo '?')
    if alive_tcp; then
      log "running: ${version}, pid $(server_pid || echo '?'), 127.0.0.1:${PORT}"
    else
      log "running: ${version} but NOT reachable on 127.0.0.1:${PORT}"
      return 1
    fi
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
    provision) cmd_provision ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    all) cmd_install; cmd_start; cmd_provision ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
