#!/usr/bin/env bash
# Install, start and provision the PostgreSQL server the test suite uses (loopback only, no systemd).
#
# usage: scripts/postgres.sh [install|start|provision|stop|status|port|url [DB]|all]   (default: all)
#
#   install    apt-get install Debian's postgresql (apt-get update only when needed); create the
#              cluster <major>/ckit (UTF-8, start=manual so no init script or unit ever starts it)
#              on 5432, or on the next port from 5433 when 5432 is taken; write its conf.d/ckit.conf
#   start      start the ckit cluster unless it already answers; wait (bounded) for pg_isready
#   provision  role ckit/ckit (LOGIN) owning databases ckit_test, ckit_test2, ckit_bench (idempotent)
#   stop       stop the ckit cluster (never another cluster or another PostgreSQL)
#   status     say whether the ckit cluster answers on 127.0.0.1:<port>
#   port       print the cluster's port on stdout
#   url [DB]   print the SQLAlchemy URL of DB (default ckit_test) on stdout
#   all        install + start + provision
#
# The server runs as the postgres user through pg_ctlcluster (systemctl redirection skipped), logs to
# /var/log/postgresql/postgresql-<major>-ckit.log and listens on 127.0.0.1 and its Unix socket only.
# Environment: CKIT_POSTGRES_TIMEOUT (seconds to wait for start/stop, default 60).
set -euo pipefail

readonly CLUSTER=ckit
readonly FIRST_PORT=5432
readonly TIMEOUT=${CKIT_POSTGRES_TIMEOUT:-60}
readonly SOCKDIR=/var/run/postgresql
readonly DATABASES=(ckit_test ckit_test2 ckit_bench)
readonly USER_NAME=ckit

LOG_TAG=postgres
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The newest PostgreSQL major version whose server binaries are installed (empty when none).
major() {
  local dir
  dir=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort -V | tail -n 1)
  [[ -n $dir && -x ${dir}/bin/postgres ]] && basename "$dir"
}

conf_dir() { printf '/etc/postgresql/%s/%s' "$(major)" "$CLUSTER"; }
cluster_exists() { [[ -n $(major) && -f $(conf_dir)/postgresql.conf ]]; }
log_file() { printf '/var/log/postgresql/postgresql-%s-%s.log' "$(major)" "$CLUSTER"; }

# The port written in the cluster's configuration.
cluster_port() {
  sed -n 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*\([0-9]\+\).*/\1/p' \
    "$(conf_dir)/postgresql.conf" | tail -n 1
}

ctl() { pg_ctlcluster --skip-systemctl-redirect "$(major)" "$CLUSTER" "$@"; }

# True when the ckit cluster accepts connections on 127.0.0.1:<port>.
alive() {
  cluster_exists || return 1
  pg_isready -q -h 127.0.0.1 -p "$(cluster_port)" -t 2 >/dev/null 2>&1
}

# True when the postmaster of the ckit cluster is running (answering or not).
running() { cluster_exists && ctl status >/dev/null 2>&1; }
gone() { ! running; }

# port_taken PORT: something listens on 127.0.0.1:PORT, or another online cluster uses its socket.
port_taken() {
  port_open "$1" && return 0
  [[ -e ${SOCKDIR}/.s.PGSQL.$1 ]] && return 0
  return 1
}

choose_port() {
  local port
  for ((port = FIRST_PORT; port < FIRST_PORT + 50; port++)); do
    if ! port_taken "$port"; then
      echo "$port"
      return 0
    fi
    log "port ${port} is taken; trying the next one"
  done
  die "no free port in ${FIRST_PORT}..$((FIRST_PORT + 49))"
}

show_logs() {
  local f
  f=$(log_file)
  [[ -s $f ]] || return 0
  log "--- last lines of $f ---"
  tail -n 40 "$f" >&2
}

write_conf() {
  local conf tmp
  conf=$(conf_dir)/conf.d/ckit.conf
  install -d -o postgres -g postgres -m 0755 "$(dirname "$conf")"
  tmp=$(mktemp)
  cat >"$tmp" <<'EOF'
# Written by consumer-kit scripts/postgres.sh: a small test server on loopback only.
# Isolation and durability are left at PostgreSQL's defaults (READ COMMITTED, fsync on).
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 128MB
ssl = off
log_min_messages = warning
log_line_prefix = '%m [%p] %q%u@%d '
EOF
  if cmp -s "$tmp" "$conf"; then
    rm -f "$tmp"
    return 1  # unchanged
  fi
  install -o postgres -g postgres -m 0644 "$tmp" "$conf"
  rm -f "$tmp"
  log "wrote $conf"
  return 0
}

# Close every descriptor above 2 in the current (sub)shell.
close_fds() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd=${fd##*/}
    ((fd > 2)) && eval "exec ${fd}>&-" 2>/dev/null
  done
  return 0
}

prepare_dirs() {
  install -d -o postgres -g postgres -m 2775 "$SOCKDIR"
  install -d -o postgres -g postgres -m 1775 /var/log/postgresql
}

cmd_install() {
  need_root
  apt_install postgresql
  [[ -n $(major) ]] || die "postgresql is installed but no server binaries under /usr/lib/postgresql"
  prepare_dirs
  if ! cluster_exists; then
    local port
    port=$(choose_port)
    log "creating cluster $(major)/${CLUSTER} on port ${port}"
    pg_createcluster --start-conf=manual --port="$port" --encoding=UTF8 --locale=C.UTF-8 \
      "$(major)" "$CLUSTER" >&2 || die "pg_createcluster failed"
  fi
  if write_conf && running; then
    log "configuration changed; restarting the ckit cluster"
    cmd_stop
    cmd_start
  fi
}

cmd_start() {
  need_root
  command -v pg_ctlcluster >/dev/null || die "postgresql is not installed: run $0 install"
  cluster_exists || die "cluster ${CLUSTER} does not exist: run $0 install"
  local port
  port=$(cluster_port)
  if alive; then
    log "already running on 127.0.0.1:${port}"
    return 0
  fi
  if ! running && port_open "$port"; then
    die "port ${port} of cluster ${CLUSTER} is taken by another server"
  fi
  prepare_dirs
  if ! running; then
    # Its own session, no inherited descriptors: nothing started here keeps the caller's stdout
    # open (a CI runner waiting for EOF would hang).
    (close_fds; exec timeout $((TIMEOUT + 10)) setsid pg_ctlcluster --skip-systemctl-redirect \
      "$(major)" "$CLUSTER" start -- -t "$TIMEOUT") </dev/null >>"$(log_file)" 2>&1 \
      || { show_logs; die "pg_ctlcluster start failed"; }
  fi
  wait_until "the server to answer" "+${TIMEOUT}" alive || { show_logs; die "PostgreSQL did not start"; }
  log "started cluster $(major)/${CLUSTER} on 127.0.0.1:${port}"
}

# psql as the postgres superuser over the Unix socket (peer authentication), SQL on stdin.
super_sql() {
  (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h "$SOCKDIR" \
    -p "$(cluster_port)" -d postgres "$@")
}

cmd_provision() {
  need_root
  alive || die "server is not running: run $0 start"
  local sql db
  # SQL goes through stdin so the (fixed, test-only) password never shows in a process list.
  sql="SELECT 'CREATE ROLE ${USER_NAME} LOGIN' WHERE NOT EXISTS"
  sql+=" (SELECT FROM pg_roles WHERE rolname = '${USER_NAME}')"$'\n\\gexec\n'
  sql+="ALTER ROLE ${USER_NAME} LOGIN PASSWORD '${USER_NAME}';"$'\n'
  for db in "${DATABASES[@]}"; do
    sql+="SELECT 'CREATE DATABASE ${db} OWNER ${USER_NAME} ENCODING ''UTF8'' TEMPLATE template0'"
    sql+=" WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '${db}')"$'\n\\gexec\n'
    sql+="ALTER DATABASE ${db} OWNER TO ${USER_NAME};"$'\n'
  done
  super_sql <<<"$sql" >/dev/null || die "provisioning failed"
  PGPASSWORD=$USER_NAME psql -X -q -h 127.0.0.1 -p "$(cluster_port)" -U "$USER_NAME" -d ckit_test \
    -c 'SELECT 1' >/dev/null || die "user ${USER_NAME} cannot log in over TCP after provisioning"
  log "provisioned ${DATABASES[*]} and role ${USER_NAME} on 127.0.0.1:$(cluster_port)"
}

cmd_stop() {
  need_root
  if ! running; then
    log "not running"
    return 0
  fi
  timeout $((TIMEOUT + 10)) pg_ctlcluster --skip-systemctl-redirect "$(major)" "$CLUSTER" stop \
    -m fast </dev/null >&2 || true
  if ! wait_until "the server to stop" "+${TIMEOUT}" gone; then
    show_logs
    die "cluster ${CLUSTER} still running ${TIMEOUT}s after stop"
  fi
  log "stopped"
}

cmd_status() {
  if ! cluster_exists; then
    log "not installed (no cluster ${CLUSTER})"
    return 3
  fi
  if alive; then
    local version
    version=$(super_sql -At -c 'SHOW server_version' 2>/dev/null || echo '?')
    log "running: PostgreSQL ${version}, cluster $(major)/${CLUSTER}, 127.0.0.1:$(cluster_port)"
  elif running; then
    log "running but NOT reachable on 127.0.0.1:$(cluster_port)"
    return 1
  else
    log "not running"
    return 3
  fi
}

cmd_port() {
  cluster_exists || die "cluster ${CLUSTER} does not exist: run $0 install"
  cluster_port
}

cmd_url() {
  local db=${1:-ckit_test}
  printf 'postgresql+psycopg://%s:%s@127.0.0.1:%s/%s\n' "$USER_NAME" "$USER_NAME" "$(cmd_port)" "$db"
}

main() {
  local cmd=${1:-all}
  case $cmd in
    install) cmd_install ;;
    start) cmd_start ;;
    provision) cmd_provision ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    port) cmd_port ;;
    url) cmd_url "${2:-}" ;;
    all) cmd_install; cmd_start; cmd_provision ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
