#!/usr/bin/env bash
# A MariaDB read replica on loopback for the replica tests (`ckit relay/reconcile --read-url`).
#
# usage: scripts/mariadb-replica.sh [start|stop|status|url primary|url replica|all]  (default: all)
#
#   start    start the replica server (127.0.0.1:3307, its own datadir, socket and server id 2)
#            and, when it does not replicate yet, seed it from its source and start replication
#            (GTID, MASTER_USE_GTID=slave_pos), or reseed it when replication stopped on an
#            error; always ends with both replication threads running (a test that stopped one
#            is undone). Idempotent.
#   stop     stop the replica (and the private source, when this script started one)
#   status   say what runs, which source the replica follows and how far behind it is
#   url R    print the SQLAlchemy URL of database ckit_replica on the primary (R = primary) or
#            on the replica (R = replica) for user ckit
#   all      start
#
# The source is the shared server of scripts/mariadb.sh (127.0.0.1:3306) when it runs with the
# binary log (mariadb.sh writes 99-ckit-binlog.cnf: server id 1, ROW format, only database
# ckit_replica logged; it takes effect at that server's next start, which setup never forces).
# When the shared server runs without the binary log, this script starts a private source on
# 127.0.0.1:3308 (server id 3, the same binlog settings) instead, so the tests run without
# restarting a server others use. Only database ckit_replica replicates, and a statement (DDL
# above all) is logged only when ckit_replica is its connection's default database: connect to
# .../ckit_replica, as `url primary` prints. The replica is
# read_only: user ckit may SELECT on `ckit%` and stop/start replication (REPLICATION SLAVE ADMIN,
# SLAVE MONITOR), nothing else, so a write that reaches the replica fails loudly.
# Environment: CKIT_REPLICA_SOURCE=auto|shared|own (default auto); CKIT_MARIADB_TIMEOUT (60).
set -euo pipefail

readonly TIMEOUT=${CKIT_MARIADB_TIMEOUT:-60}
readonly BASE=/var/lib/ckit-mariadb
readonly DATABASE=ckit_replica
readonly REPL_USER=ckit_repl
readonly REPL_PASSWORD=ckit_repl   # test-only, loopback only; sent on stdin, never as an argument
readonly SHARED_PORT=3306
readonly SHARED_SOCKET=/run/mysqld/mysqld.sock
readonly BINLOG_CONF=/etc/mysql/mariadb.conf.d/99-ckit-binlog.cnf
# name port server_id
readonly REPLICA=(replica 3307 2)
readonly OWN_SOURCE=(source 3308 3)

LOG_TAG=mariadb-replica
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir_of() { printf '%s/%s' "$BASE" "$1"; }
socket_of() { printf '%s/%s/mysqld.sock' "$BASE" "$1"; }

# sql SOCKET ARGS...: run the client as root over a socket (SQL on stdin or in -e).
sql() {
  local socket=$1
  shift
  mariadb --no-defaults --protocol=socket --socket="$socket" -uroot --batch --skip-column-names \
    "$@"
}

alive_socket() {
  mariadb-admin --no-defaults --protocol=socket --socket="$1" --connect-timeout=2 ping \
    >/dev/null 2>&1
}

# The shared server answers and has its binary log on.
shared_has_binlog() {
  alive_socket "$SHARED_SOCKET" && [[ $(sql "$SHARED_SOCKET" -e 'SELECT @@log_bin' 2>/dev/null) == 1 ]]
}

# Print "shared" or "own": where the replica's source is.
source_kind() {
  case ${CKIT_REPLICA_SOURCE:-auto} in
    shared) echo shared ;;
    own) echo own ;;
    auto) if shared_has_binlog; then echo shared; else echo own; fi ;;
    *) die "CKIT_REPLICA_SOURCE must be auto, shared or own" ;;
  esac
}

source_port() { if [[ $1 == shared ]]; then echo "$SHARED_PORT"; else echo "${OWN_SOURCE[1]}"; fi; }
source_socket() {
  if [[ $1 == shared ]]; then echo "$SHARED_SOCKET"; else socket_of "${OWN_SOURCE[0]}"; fi
}

# write_instance_conf NAME PORT SERVER_ID: the option file of a private instance.
write_instance_conf() {
  local name=$1 port=$2 id=$3 dir
  dir=$(dir_of "$name")
  install -d -o mysql -g mysql -m 0750 "$dir"
  {
    echo "# Written by consumer-kit scripts/mariadb-replica.sh: the ${name} of the replica tests."
    if [[ $name == source ]]; then
      # the same binary log settings as the shared server; the lines below override its id
      echo "!include ${BINLOG_CONF}"
    fi
    private_mysqld_conf "$id" "$port" "$dir"
    if [[ $name == replica ]]; then
      cat <<EOF
read_only               = 1
relay_log               = ckit-relay
replicate_do_db         = ${DATABASE}
EOF
    fi
  } >"${dir}/my.cnf.new"
  mv -f "${dir}/my.cnf.new" "${dir}/my.cnf"
  chown mysql:mysql "${dir}/my.cnf"
}

show_log() {
  local f
  f="$(dir_of "$1")/error.log"
  [[ -s $f ]] && { log "--- last lines of $f ---"; tail -n 30 "$f" >&2; }
  return 0
}

# start_instance NAME PORT SERVER_ID: initialise the datadir once, start the server unless it
# answers, wait (bounded) until it does.
start_instance() {
  local name=$1 port=$2 id=$3 dir socket
  dir=$(dir_of "$name")
  socket=$(socket_of "$name")
  if alive_socket "$socket"; then
    port_open "$port" || die "the ${name} runs but does not listen on 127.0.0.1:${port}"
    return 0
  fi
  port_open "$port" && die "127.0.0.1:${port} is taken by another process; the ${name} needs it"
  [[ $name == source && ! -f $BINLOG_CONF ]] && die "${BINLOG_CONF} is missing: run scripts/mariadb.sh install"
  write_instance_conf "$name" "$port" "$id"
  if [[ ! -d ${dir}/data/mysql ]]; then
    log "initialising ${dir}/data"
    mariadb-install-db --defaults-file="${dir}/my.cnf" --user=mysql --skip-test-db \
      --auth-root-authentication-method=socket >>"${dir}/launch.log" 2>&1 \
      || { show_log "$name"; die "mariadb-install-db failed for the ${name}"; }
  fi
  log "starting the ${name} on 127.0.0.1:${port}"
  # own session, no inherited descriptors: nothing keeps the caller's stdout open
  setsid mariadbd --defaults-file="${dir}/my.cnf" --user=mysql </dev/null >>"${dir}/launch.log" 2>&1 &
  wait_until "the ${name} to answer" "+${TIMEOUT}" alive_socket "$socket" \
    || { show_log "$name"; die "the ${name} did not start"; }
  wait_until "the ${name} to listen on ${port}" "+${TIMEOUT}" port_open "$port" \
    || { show_log "$name"; die "the ${name} does not listen on 127.0.0.1:${port}"; }
}

stop_instance() {
  local name=$1 socket pid=""
  socket=$(socket_of "$name")
  if ! alive_socket "$socket"; then
    return 0
  fi
  [[ -s $(dir_of "$name")/mysqld.pid ]] && pid=$(cat "$(dir_of "$name")/mysqld.pid")
  sql "$socket" -e 'SHUTDOWN' || die "shutdown of the ${name} failed"
  gone() { ! alive_socket "$socket" && { [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; }; }
  wait_until "the ${name} to stop" "+${TIMEOUT}" gone || die "the ${name} did not stop"
  log "stopped the ${name}"
}

# The database, the replication user and (on a private source) user ckit.
provision_source() {
  local kind=$1 socket provision=""
  socket=$(source_socket "$kind")
  provision+="CREATE DATABASE IF NOT EXISTS \`${DATABASE}\` CHARACTER SET utf8mb4;"$'\n'
  provision+="CREATE USER IF NOT EXISTS '${REPL_USER}'@'127.0.0.1' IDENTIFIED BY '${REPL_PASSWORD}';"$'\n'
  provision+="GRANT REPLICATION SLAVE ON *.* TO '${REPL_USER}'@'127.0.0.1';"$'\n'
  if [[ $kind == own ]]; then
    for host in 127.0.0.1 localhost; do
      provision+="CREATE USER IF NOT EXISTS 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
      provision+="GRANT ALL PRIVILEGES ON \`ckit%\`.* TO 'ckit'@'${host}';"$'\n'
    done
  fi
  sql "$socket" <<<"$provision" || die "provisioning the source failed"
}

provision_replica() {
  local socket provision="" host
  socket=$(socket_of "${REPLICA[0]}")
  for host in 127.0.0.1 localhost; do
    provision+="CREATE USER IF NOT EXISTS 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
    provision+="GRANT SELECT ON \`ckit%\`.* TO 'ckit'@'${host}';"$'\n'
    provision+="GRANT REPLICATION SLAVE ADMIN, SLAVE MONITOR ON *.* TO 'ckit'@'${host}';"$'\n'
  done
  sql "$socket" <<<"$provision" || die "provisioning the replica failed"
}

# slave_field NAME: one field of SHOW SLAVE STATUS on the replica (empty when not configured).
slave_field() {
  mariadb --no-defaults --protocol=socket --socket="$(socket_of "${REPLICA[0]}")" -uroot -E \
    -e 'SHOW SLAVE STATUS' 2>/dev/null | sed -n "s/^ *$1: //p"
}

threads_running() {
  [[ $(slave_field Slave_IO_Running) == Yes && $(slave_field Slave_SQL_Running) == Yes ]]
}

# seed KIND: copy database ckit_replica from the source (a consistent snapshot with its GTID
# position: mariadb-dump --single-transaction takes no global read lock on MariaDB) and start
# replicating from that position.
seed() {
  local kind=$1 port src replica dump
  port=$(source_port "$kind")
  src=$(source_socket "$kind")
  replica=$(socket_of "${REPLICA[0]}")
  log "seeding the replica from 127.0.0.1:${port} (database ${DATABASE})"
  dump=$(mktemp)
  # shellcheck disable=SC2064
  trap "rm -f '$dump'" RETURN
  mariadb-dump --no-defaults --protocol=socket --socket="$src" -uroot --single-transaction \
    --master-data=2 --gtid --databases "$DATABASE" >"$dump" || die "mariadb-dump of the source failed"
  local gtid
  gtid=$(sed -n "s/^-- SET GLOBAL gtid_slave_pos='\(.*\)';$/\1/p" "$dump" | head -n 1)
  sql "$replica" <<<"STOP SLAVE; RESET SLAVE ALL; DROP DATABASE IF EXISTS \`${DATABASE}\`;" \
    || die "could not reset the replica"
  sql "$replica" <"$dump" || die "loading the dump into the replica failed"
  sql "$replica" <<EOF || die "CHANGE MASTER on the replica failed"
SET GLOBAL gtid_slave_pos = '${gtid}';
CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = ${port}, MASTER_USER = '${REPL_USER}',
  MASTER_PASSWORD = '${REPL_PASSWORD}', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
EOF
}

cmd_start() {
  need_root
  command -v mariadbd >/dev/null || die "mariadb is not installed: run scripts/mariadb.sh install"
  local kind
  kind=$(source_kind)
  if [[ $kind == own ]]; then
    log "the shared server runs without the binary log: using a private source on ${OWN_SOURCE[1]}"
    start_instance "${OWN_SOURCE[@]}"
  else
    shared_has_binlog || die "the shared server on ${SHARED_PORT} does not run with the binary log"
    stop_instance "${OWN_SOURCE[0]}"  # a private source of an earlier run is not needed now
  fi
  provision_source "$kind"
  start_instance "${REPLICA[@]}"
  provision_replica
  local port
  port=$(source_port "$kind")
  if [[ $(slave_field Master_Port) != "$port" ]]; then
    seed "$kind"
  elif [[ $(slave_field Last_SQL_Errno) != 0 ]]; then
    # e.g. a row event for a table whose CREATE was not logged (made while another database
    # was the default one: binlog_do_db filters statements by the default database)
    log "replication stopped on an error ($(slave_field Last_SQL_Error)); reseeding"
    seed "$kind"
  fi
  sql "$(socket_of "${REPLICA[0]}")" -e 'START SLAVE' 2>/dev/null || true
  if ! wait_until "replication to run" "+${TIMEOUT}" threads_running; then
    log "Last_IO_Error: $(slave_field Last_IO_Error)"
    log "Last_SQL_Error: $(slave_field Last_SQL_Error)"
    die "replication does not run"
  fi
  log "replica on 127.0.0.1:${REPLICA[1]} follows 127.0.0.1:${port} (${kind})"
}

cmd_stop() {
  need_root
  stop_instance "${REPLICA[0]}"
  stop_instance "${OWN_SOURCE[0]}"
}

cmd_status() {
  local replica
  replica=$(socket_of "${REPLICA[0]}")
  if ! alive_socket "$replica"; then
    log "replica not running"
    return 3
  fi
  log "replica 127.0.0.1:${REPLICA[1]} follows 127.0.0.1:$(slave_field Master_Port):" \
    "IO $(slave_field Slave_IO_Running), SQL $(slave_field Slave_SQL_Running)," \
    "$(slave_field Seconds_Behind_Master)s behind, at $(slave_field Gtid_IO_Pos)"
  alive_socket "$(socket_of "${OWN_SOURCE[0]}")" && log "private source on 127.0.0.1:${OWN_SOURCE[1]} runs"
  threads_running
}

# The primary is whatever the replica follows (its Master_Port); before it follows anything,
# what `start` would choose.
cmd_url() {
  local port
  case ${1:-} in
    primary)
      port=$(slave_field Master_Port 2>/dev/null || true)
      [[ -n $port ]] || port=$(source_port "$(source_kind)")
      ;;
    replica) port=${REPLICA[1]} ;;
    *) usage; exit 2 ;;
  esac
  printf 'mysql+pymysql://ckit:ckit@127.0.0.1:%s/%s\n' "$port" "$DATABASE"
}

main() {
  local cmd=${1:-all}
  case $cmd in
    start | all) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) cmd_url "${2:-}" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
