#!/usr/bin/env bash
# A two-node MariaDB Galera cluster on loopback for the Galera tests
# (tests/integration/test_galera.py).
#
# usage: scripts/mariadb-galera.sh [start|stop|status|url [1|2]|all]  (default: all)
#
#   start    start node 1 (127.0.0.1:3309, group communication on 127.0.0.1:4567) as a new
#            cluster, then node 2 (127.0.0.1:3310, group communication on 127.0.0.1:4577), which
#            joins it (a state transfer by rsync from node 1 on first start), and wait until both
#            are the Primary component, synced and ready. Each node has its own datadir and
#            socket under /var/lib/ckit-mariadb/galera and .../galera2. Idempotent: a node 2 that
#            is not in node 1's cluster (node 1 was restarted, node 2 was left cut off) is
#            stopped and joins again with a full copy of node 1's state (its own is dropped, so
#            the two cannot diverge).
#   stop     stop node 2, then node 1
#   status   say whether each node runs, its cluster status and whether it is ready
#   url [N]  print the SQLAlchemy URL of database ckit_galera on node N (default 1) for user ckit
#   all      start
#
# Galera comes with Debian's mariadb-server (package galera-4 and rsync, for the state transfer
# to node 2, are dependencies of it), so nothing beyond scripts/mariadb.sh is installed. Node 1
# weighs 2 and node 2 weighs 1 in the quorum, so node 2 cut off from node 1 (a test sets
# gmcast.isolate=1 on it) leaves the Primary component while node 1 stays in it. A node out of
# the Primary component, or taken out of service (wsrep_reject_queries), answers every statement
# on a table with error 1047 "WSREP has not yet prepared node for application use". The group
# timeouts are short (a peer is suspected after 1 s), so that a test's partition takes effect
# at once. User ckit has all privileges on `ckit%` and SUPER on these private nodes, so a test
# can set those variables itself.
# Environment: CKIT_MARIADB_TIMEOUT (60).
set -euo pipefail

readonly TIMEOUT=${CKIT_MARIADB_TIMEOUT:-60}
readonly BASE=/var/lib/ckit-mariadb
readonly DATABASE=ckit_galera
readonly PROVIDER=/usr/lib/galera/libgalera_smm.so
# per node (index 1 and 2): directory under BASE, client port, group communication port (the
# incremental transfer's port is the next one), state transfer port, quorum weight, server id
readonly DIRS=(- galera galera2)
readonly PORTS=(- 3309 3310)
readonly GCOMM_PORTS=(- 4567 4577)
readonly SST_PORTS=(- 4444 4454)
readonly WEIGHTS=(- 2 1)
readonly SERVER_IDS=(- 9 10)
# a peer is suspected after 1 s of silence and dropped after 2 s (defaults: 5 s and 15 s)
readonly EVS="evs.keepalive_period=PT0.2S;evs.inactive_check_period=PT0.2S;evs.suspect_timeout=PT1S;evs.inactive_timeout=PT2S;evs.install_timeout=PT2S"

LOG_TAG=mariadb-galera
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir_of() { printf '%s/%s' "$BASE" "${DIRS[$1]}"; }

# sql N ARGS...: run the client as root on node N's socket (SQL on stdin or in -e).
sql() {
  local node=$1
  shift
  mariadb --no-defaults --protocol=socket --socket="$(dir_of "$node")/mysqld.sock" -uroot \
    --batch --skip-column-names "$@"
}

alive() {
  mariadb-admin --no-defaults --protocol=socket --socket="$(dir_of "$1")/mysqld.sock" \
    --connect-timeout=2 ping >/dev/null 2>&1
}

status_of() { sql "$1" -e "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | cut -f2; }

primary_and_ready() {
  [[ $(status_of "$1" wsrep_cluster_status) == Primary && $(status_of "$1" wsrep_ready) == ON ]]
}

# node 2 is in node 1's cluster, both synced
joined() {
  primary_and_ready 2 && [[ $(status_of 2 wsrep_cluster_size) == 2 \
    && $(status_of 2 wsrep_local_state_comment) == Synced \
    && $(status_of 2 wsrep_cluster_state_uuid) == "$(status_of 1 wsrep_cluster_state_uuid)" ]]
}

show_log() {
  local log_file
  log_file="$(dir_of "$1")/error.log"
  [[ -s $log_file ]] && { log "--- last lines of ${log_file} ---"; tail -n 30 "$log_file" >&2; }
  return 0
}

write_conf() {
  local node=$1 dir address gcomm=${GCOMM_PORTS[$1]}
  dir=$(dir_of "$node")
  # node 1 starts a new cluster (the empty address); node 2 joins node 1
  address=gcomm://
  ((node == 1)) || address="gcomm://127.0.0.1:${GCOMM_PORTS[1]}"
  install -d -o mysql -g mysql -m 0750 "$dir"
  {
    echo "# Written by consumer-kit scripts/mariadb-galera.sh: node ${node} of a Galera cluster for the tests."
    private_mysqld_conf "${SERVER_IDS[$node]}" "${PORTS[$node]}" "$dir"
    cat <<EOF
binlog_format           = ROW
innodb_autoinc_lock_mode = 2
wsrep_on                = ON
wsrep_provider          = ${PROVIDER}
wsrep_cluster_name      = ckit
wsrep_cluster_address   = ${address}
wsrep_node_address      = 127.0.0.1:${gcomm}
wsrep_sst_method        = rsync
wsrep_sst_receive_address = 127.0.0.1:${SST_PORTS[$node]}
wsrep_provider_options  = "gmcast.listen_addr=tcp://127.0.0.1:${gcomm};ist.recv_addr=127.0.0.1:$((gcomm + 1));gcache.size=32M;pc.weight=${WEIGHTS[$node]};${EVS}"
EOF
  } >"${dir}/my.cnf.new"
  mv -f "${dir}/my.cnf.new" "${dir}/my.cnf"
  chown mysql:mysql "${dir}/my.cnf"
}

# launch N: write node N's conf, initialise its datadir on first start, start it and wait until it
# answers
launch() {
  local node=$1 dir port=${PORTS[$1]} gcomm=${GCOMM_PORTS[$1]}
  dir=$(dir_of "$node")
  port_open "$port" && die "127.0.0.1:${port} is taken by another process; Galera node ${node} needs it"
  port_open "$gcomm" && die "127.0.0.1:${gcomm} is taken by another process; Galera node ${node} needs it"
  write_conf "$node"
  if [[ ! -d ${dir}/data/mysql ]]; then
    log "initialising ${dir}/data"
    mariadb-install-db --defaults-file="${dir}/my.cnf" --user=mysql --skip-test-db \
      --auth-root-authentication-method=socket >>"${dir}/launch.log" 2>&1 \
      || { show_log "$node"; die "mariadb-install-db failed for Galera node ${node}"; }
  fi
  # A node 1 that crashed, or that node 2 outlived, is not marked safe to bootstrap; it starts
  # the cluster, so its state is the cluster's (node 2 takes node 1's state when it joins).
  if ((node == 1)) && [[ -f ${dir}/data/grastate.dat ]] \
      && grep -q '^safe_to_bootstrap: 0' "${dir}/data/grastate.dat"; then
    log "node 1 is not marked safe to bootstrap (it crashed, or node 2 outlived it); marking it: it starts the cluster"
    sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "${dir}/data/grastate.dat"
  fi
  # node 1's empty gcomm:// address bootstraps a new cluster. Not --wsrep-new-cluster: it stays
  # in force for the server's life, so a node pointed at nobody would bootstrap itself again at
  # once instead of staying out of the Primary component
  log "starting Galera node ${node} on 127.0.0.1:${port}"
  setsid mariadbd --defaults-file="${dir}/my.cnf" --user=mysql \
    </dev/null >>"${dir}/launch.log" 2>&1 &
  wait_until "Galera node ${node} to answer" "+${TIMEOUT}" alive "$node" \
    || { show_log "$node"; die "Galera node ${node} did not start"; }
}

start_node1() {
  alive 1 || launch 1
  # a test that failed half way may have left the node out of the Primary component
  if [[ $(status_of 1 wsrep_cluster_status) != Primary ]]; then
    log "node 1 is not the Primary component; bootstrapping it again"
    sql 1 -e "SET GLOBAL wsrep_cluster_address = 'gcomm://'" || die "could not bootstrap node 1"
  fi
  sql 1 -e "SET GLOBAL wsrep_reject_queries = NONE" || die "could not set wsrep_reject_queries"
  wait_until "Galera node 1 to be Primary and ready" "+${TIMEOUT}" primary_and_ready 1 \
    || { show_log 1; die "Galera node 1 is not ready"; }
}

start_node2() {
  local dir
  dir=$(dir_of 2)
  if alive 2; then
    # a test that failed half way may have left node 2 cut off or rejecting queries (it rejoins
    # at once); best effort: a node whose provider is disconnected refuses the first
    sql 2 -e "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'" 2>/dev/null \
      || log "could not set gmcast.isolate=0 on node 2"
    sql 2 -e "SET GLOBAL wsrep_reject_queries = NONE" 2>/dev/null \
      || log "could not set wsrep_reject_queries on node 2"
    if ! wait_until "Galera node 2 to be in node 1's cluster" "+10" joined; then
      log "node 2 is not in node 1's cluster; restarting it with a full copy of node 1's state"
      stop_node 2
    fi
  fi
  if ! alive 2; then
    # node 2's state is whatever node 1 has: without its saved position and write-set cache it
    # takes a full copy (a few seconds), where an incremental one could keep writes node 1
    # never had (node 1 bootstrapped from an older state) or fail on a history node 1 lacks
    rm -f "${dir}/data/grastate.dat" "${dir}/data/galera.cache"
    launch 2
  fi
  wait_until "Galera node 2 to join node 1, synced and ready" "+${TIMEOUT}" joined \
    || { show_log 2; die "Galera node 2 did not join node 1"; }
}

provision() {
  local provision="" host
  provision+="CREATE DATABASE IF NOT EXISTS \`${DATABASE}\` CHARACTER SET utf8mb4;"$'\n'
  for host in 127.0.0.1 localhost; do
    provision+="CREATE USER IF NOT EXISTS 'ckit'@'${host}' IDENTIFIED BY 'ckit';"$'\n'
    provision+="GRANT ALL PRIVILEGES ON \`ckit%\`.* TO 'ckit'@'${host}';"$'\n'
    provision+="GRANT SUPER ON *.* TO 'ckit'@'${host}';"$'\n'
  done
  # on node 1; the cluster replicates it to node 2
  sql 1 <<<"$provision" || die "provisioning the Galera cluster failed"
}

cmd_start() {
  need_root
  command -v mariadbd >/dev/null || die "mariadb is not installed: run scripts/mariadb.sh install"
  [[ -f $PROVIDER ]] || die "${PROVIDER} is missing: Debian's galera-4 (a dependency of mariadb-server)"
  command -v rsync >/dev/null || die "rsync is missing (a dependency of mariadb-server): run scripts/mariadb.sh install"
  start_node1
  provision
  start_node2
  local node
  for node in 1 2; do
    wait_until "Galera node ${node} to listen on ${PORTS[$node]}" "+${TIMEOUT}" port_open "${PORTS[$node]}" \
      || die "Galera node ${node} does not listen on 127.0.0.1:${PORTS[$node]}"
  done
  log "Galera nodes on 127.0.0.1:${PORTS[1]} and 127.0.0.1:${PORTS[2]}: Primary, synced, ready"
}

stop_node() {
  local node=$1 pid="" dir
  dir=$(dir_of "$node")
  alive "$node" || return 0
  [[ -s ${dir}/mysqld.pid ]] && pid=$(cat "${dir}/mysqld.pid")
  # mariadb-admin shutdown, not the SHUTDOWN statement: a node out of the Primary component
  # refuses statements (1047) but not this; else SIGTERM to the pid in its own pid file
  if ! mariadb-admin --no-defaults --protocol=socket --socket="${dir}/mysqld.sock" \
      --connect-timeout=2 shutdown 2>/dev/null; then
    [[ -n $pid ]] || die "shutdown of Galera node ${node} failed and ${dir}/mysqld.pid is empty"
    log "shutdown of Galera node ${node} refused; sending SIGTERM to ${pid}"
    kill -TERM "$pid" 2>/dev/null || true
  fi
  gone() { ! alive "$node" && { [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; }; }
  wait_until "Galera node ${node} to stop" "+${TIMEOUT}" gone || die "Galera node ${node} did not stop"
  log "stopped Galera node ${node}"
}

cmd_stop() {
  need_root
  stop_node 2
  stop_node 1
}

cmd_status() {
  local node rc=0
  for node in 1 2; do
    if ! alive "$node"; then
      log "Galera node ${node} not running"
      rc=3
      continue
    fi
    log "Galera node ${node} 127.0.0.1:${PORTS[$node]}: cluster $(status_of "$node" wsrep_cluster_status)" \
      "of $(status_of "$node" wsrep_cluster_size), ready $(status_of "$node" wsrep_ready)," \
      "state $(status_of "$node" wsrep_local_state_comment)"
    primary_and_ready "$node" || rc=1
  done
  # two clusters of one each are both Primary: node 2 must be in node 1's
  if ((rc == 0)) && ! joined; then
    log "Galera node 2 is not in node 1's cluster (cluster state $(status_of 2 wsrep_cluster_state_uuid)," \
      "node 1's $(status_of 1 wsrep_cluster_state_uuid))"
    rc=1
  fi
  return "$rc"
}

main() {
  local cmd=${1:-all}
  case $cmd in
    start | all) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url)
      local node=${2:-1}
      [[ $node == [12] ]] || { usage; exit 2; }
      printf 'mysql+pymysql://ckit:ckit@127.0.0.1:%s/%s\n' "${PORTS[$node]}" "$DATABASE"
      ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
