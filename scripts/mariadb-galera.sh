#!/usr/bin/env bash
# A one-node MariaDB Galera cluster on loopback for the Galera tests (tests/test_galera.py).
#
# usage: scripts/mariadb-galera.sh [start|stop|status|url|all]  (default: all)
#
#   start    start the node (127.0.0.1:3309, group communication on 127.0.0.1:4567, its own
#            datadir and socket under /var/lib/ckit-mariadb/galera) as a new cluster of one,
#            and wait until it is the Primary component and ready. Idempotent.
#   stop     stop the node
#   status   say whether the node runs, its cluster status and whether it is ready
#   url      print the SQLAlchemy URL of database ckit_galera for user ckit
#   all      start
#
# Galera comes with Debian's mariadb-server (package galera-4, a dependency of it), so nothing
# beyond scripts/mariadb.sh is installed. One node is enough to produce what a client sees of a
# cluster in trouble: a node out of the Primary component (wsrep_cluster_address pointed at
# nobody) or taken out of service (wsrep_reject_queries) answers every statement on a table with
# error 1047 "WSREP has not yet prepared node for application use". User ckit has all privileges
# on `ckit%` and SUPER on this private node, so a test can set those variables itself (and set
# wsrep_cluster_address back to gcomm://, which bootstraps the node again).
# Environment: CKIT_MARIADB_TIMEOUT (60).
set -euo pipefail

readonly TIMEOUT=${CKIT_MARIADB_TIMEOUT:-60}
readonly DIR=/var/lib/ckit-mariadb/galera
readonly SOCKET=${DIR}/mysqld.sock
readonly PORT=3309
readonly GCOMM_PORT=4567
readonly DATABASE=ckit_galera
readonly PROVIDER=/usr/lib/galera/libgalera_smm.so

LOG_TAG=mariadb-galera
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sql() {
  mariadb --no-defaults --protocol=socket --socket="$SOCKET" -uroot --batch --skip-column-names \
    "$@"
}

alive() {
  mariadb-admin --no-defaults --protocol=socket --socket="$SOCKET" --connect-timeout=2 ping \
    >/dev/null 2>&1
}

status_of() { sql -e "SHOW GLOBAL STATUS LIKE '$1'" 2>/dev/null | cut -f2; }

primary_and_ready() {
  [[ $(status_of wsrep_cluster_status) == Primary && $(status_of wsrep_ready) == ON ]]
}

show_log() {
  [[ -s ${DIR}/error.log ]] && { log "--- last lines of ${DIR}/error.log ---"; tail -n 30 "${DIR}/error.log" >&2; }
  return 0
}

write_conf() {
  install -d -o mysql -g mysql -m 0750 "$DIR"
  {
    echo "# Written by consumer-kit scripts/mariadb-galera.sh: a one-node Galera cluster for the tests."
    private_mysqld_conf 9 "$PORT" "$DIR"
    cat <<EOF
binlog_format           = ROW
innodb_autoinc_lock_mode = 2
wsrep_on                = ON
wsrep_provider          = ${PROVIDER}
wsrep_cluster_name      = ckit
wsrep_cluster_address   = gcomm://
wsrep_node_address      = 127.0.0.1
wsrep_provider_options  = "gmcast.listen_addr=tcp://127.0.0.1:${GCOMM_PORT};ist.recv_addr=127.0.0.1:4568;gcache.size=32M"
wsrep_sst_method        = rsync
EOF
  } >"${DIR}/my.cnf.new"
  mv -f "${DIR}/my.cnf.new" "${DIR}/my.cnf"
  chown mysql:mysql "${DIR}/my.cnf"
}

cmd_start() {
  need_root
  command -v mariadbd >/dev/null || die "mariadb is not installed: run scripts/mariadb.sh install"
  [[ -f $PROVIDER ]] || die "${PROVIDER} is missing: Debian's galera-4 (a dependency of mariadb-server)"
  if ! alive; then
    port_open "$PORT" && die "127.0.0.1:${PORT} is taken by another process; the Galera node needs it"
    port_open "$GCOMM_PORT" && die "127.0.0.1:${GCOMM_PORT} is taken by another process; the Galera node needs it"
    write_conf
    if [[ ! -d ${DIR}/data/mysql ]]; then
      log "initialising ${DIR}/data"
      mariadb-install-db --defaults-file="${DIR}/my.cnf" --user=mysql --skip-test-db \
        --auth-root-authentication-method=socket >>"${DIR}/launch.log" 2>&1 \
        || { show_log; die "mariadb-install-db failed"; }
    fi
    # A node stopped by a crash is not marked safe to bootstrap; it is the cluster's only
    # node, so its state is the cluster's.
    if [[ -f ${DIR}/data/grastate.dat ]] && grep -q '^safe_to_bootstrap: 0' "${DIR}/data/grastate.dat"; then
      log "the node did not stop cleanly; marking it safe to bootstrap (it is the only node)"
      sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "${DIR}/data/grastate.dat"
    fi
    # the empty gcomm:// address bootstraps a new cluster. Not --wsrep-new-cluster: it stays in
    # force for the server's life, so a node pointed at nobody would bootstrap itself again at
    # once instead of staying out of the Primary component
    log "starting the Galera node on 127.0.0.1:${PORT} (a new cluster of one)"
    setsid mariadbd --defaults-file="${DIR}/my.cnf" --user=mysql \
      </dev/null >>"${DIR}/launch.log" 2>&1 &
    wait_until "the Galera node to answer" "+${TIMEOUT}" alive || { show_log; die "the Galera node did not start"; }
  fi
  # a test that failed half way may have left the node out of the Primary component
  if [[ $(status_of wsrep_cluster_status) != Primary ]]; then
    log "the node is not the Primary component; bootstrapping it again"
    sql -e "SET GLOBAL wsrep_cluster_address = 'gcomm://'" || die "could not bootstrap the node"
  fi
  sql -e "SET GLOBAL wsrep_reject_queries = NONE" || die "could not set wsrep_reject_queries"
  wait_until "the Galera node to be Primary and ready" "+${TIMEOUT}" primary_and_ready \
    || { show_log; die "the Galera node is not ready"; }
  local provision="" host
  provision+="CREATE DATABASE IF NOT EXISTS \`${DATABASE}\` CHARACTER SET utf8mb4;"$'\n'
  for host in 127.0.0.1 localhost; do
    provision+="CREATE USER IF NOT EXISTS 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
    provision+="GRANT ALL PRIVILEGES ON \`ckit%\`.* TO 'ckit'@'${host}';"$'\n'
    provision+="GRANT SUPER ON *.* TO 'ckit'@'${host}';"$'\n'
  done
  sql <<<"$provision" || die "provisioning the Galera node failed"
  wait_until "the Galera node to listen on ${PORT}" "+${TIMEOUT}" port_open "$PORT" \
    || die "the Galera node does not listen on 127.0.0.1:${PORT}"
  log "Galera node on 127.0.0.1:${PORT}: Primary, ready"
}

cmd_stop() {
  need_root
  alive || return 0
  local pid=""
  [[ -s ${DIR}/mysqld.pid ]] && pid=$(cat "${DIR}/mysqld.pid")
  sql -e 'SHUTDOWN' || die "shutdown of the Galera node failed"
  gone() { ! alive && { [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; }; }
  wait_until "the Galera node to stop" "+${TIMEOUT}" gone || die "the Galera node did not stop"
  log "stopped the Galera node"
}

cmd_status() {
  if ! alive; then
    log "Galera node not running"
    return 3
  fi
  log "Galera node 127.0.0.1:${PORT}: cluster $(status_of wsrep_cluster_status)," \
    "ready $(status_of wsrep_ready), state $(status_of wsrep_local_state_comment)"
  primary_and_ready
}

main() {
  local cmd=${1:-all}
  case $cmd in
    start | all) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) printf 'mysql+pymysql://ckit:ckit@127.0.0.1:%s/%s\n' "$PORT" "$DATABASE" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
