#!/usr/bin/env bash
# Install and start everything the test suite needs, idempotently, on loopback only.
#
# usage: scripts/setup.sh
#
# Steps: python-deps.sh (extras dev,spark,rocketmq,rocketmq5), mariadb.sh, mariadb-replica.sh,
# mariadb-galera.sh,
# postgres.sh, redis.sh, jdbc.sh, librocketmq.sh, `rocketmq.sh start` (4.9.7) and
# `rocketmq5.sh start` (5.3.3 and its proxy).
# One line per step with its duration; a step's own output goes to a log file, whose tail is
# printed when the step fails.
# Writes the service addresses to .ckit-test.env at the repo root (source it; nothing is exported
# from here). A second run is a fast no-op when everything is already up.
# Environment: CKIT_SETUP_VERBOSE=1 streams each step's output instead of logging it;
#   CKIT_SETUP_LOG_DIR (default ${TMPDIR:-/tmp}/ckit-setup).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly ROOT
readonly SCRIPTS=${ROOT}/scripts
readonly ENV_FILE=${ROOT}/.ckit-test.env
readonly LOG_DIR=${CKIT_SETUP_LOG_DIR:-${TMPDIR:-/tmp}/ckit-setup}
readonly LOCK=${TMPDIR:-/tmp}/ckit-setup.lock

usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0" >&2; }

# step NAME COMMAND... : run one step, print "setup: NAME ... ok (1.2s)", stop everything on failure.
step() {
  local name=$1 start rc=0 logfile
  shift
  logfile=${LOG_DIR}/${name}.log
  start=$EPOCHREALTIME
  # fd 9 (the setup lock) is closed for the step: a daemon it starts must not inherit the lock.
  if [[ ${CKIT_SETUP_VERBOSE:-} == 1 ]]; then
    "$@" </dev/null 9>&- || rc=$?
  else
    "$@" </dev/null >"$logfile" 2>&1 9>&- || rc=$?
  fi
  local elapsed
  elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if ((rc != 0)); then
    printf 'setup: %-12s FAILED (exit %d, %ss)\n' "$name" "$rc" "$elapsed" >&2
    if [[ -s $logfile && ${CKIT_SETUP_VERBOSE:-} != 1 ]]; then
      printf -- '--- last 40 lines of %s ---\n' "$logfile" >&2
      tail -n 40 "$logfile" >&2
    fi
    printf 'setup: step %s failed; re-run with CKIT_SETUP_VERBOSE=1 for its full output\n' \
      "$name" >&2
    exit 1
  fi
  printf 'setup: %-12s ok (%ss)\n' "$name" "$elapsed"
}

write_env() {
  local jars=$1 pg_url=$2 pg_url2=$3 primary_url=$4 replica_url=$5 galera_url=$6 galera_url2=$7 tmp
  tmp=$(mktemp "${ENV_FILE}.XXXXXX")
  cat >"$tmp" <<EOF
# Written by scripts/setup.sh: addresses of the local test services (fixed test credentials).
CKIT_TEST_MYSQL_URL=mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test
CKIT_TEST_MYSQL_URL2=mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test2
CKIT_TEST_MYSQL_SHARD_URLS=mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_shard1,mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_shard2,mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_shard3
CKIT_TEST_MYSQL_PRIMARY_URL=${primary_url}
CKIT_TEST_MYSQL_REPLICA_URL=${replica_url}
CKIT_TEST_MYSQL_GALERA_URL=${galera_url}
CKIT_TEST_MYSQL_GALERA_URL2=${galera_url2}
CKIT_TEST_PG_URL=${pg_url}
CKIT_TEST_PG_URL2=${pg_url2}
CKIT_TEST_REDIS_URL=redis://127.0.0.1:6379/0
CKIT_TEST_ROCKETMQ=127.0.0.1:9876
CKIT_TEST_ROCKETMQ5_NAMESRV=127.0.0.1:9886
CKIT_TEST_ROCKETMQ5_PROXY=127.0.0.1:8081
CKIT_JDBC_JARS=${jars}
EOF
  chmod 0644 "$tmp"
  mv -f "$tmp" "$ENV_FILE"
}

main() {
  case ${1:-} in
    "") ;;
    -h | --help) usage; return 0 ;;
    *) usage; return 2 ;;
  esac
  mkdir -p "$LOG_DIR"
  # Serialise concurrent setups (several checkouts on one machine share the services).
  exec 9>"$LOCK"
  if ! flock -n 9; then
    echo "setup: waiting for another scripts/setup.sh to finish ($LOCK)"
    flock -w 1800 9 || { echo "setup: gave up waiting for $LOCK" >&2; exit 1; }
  fi
  local total=$EPOCHREALTIME

  # Both RocketMQ clients in one environment: pip installs rocketmq-python-client after
  # rocketmq-client-python, so the shared rocketmq/__init__.py is 5.x's (docs/rocketmq5.md).
  step python-deps env CKIT_PY_EXTRAS="${CKIT_PY_EXTRAS:-dev,spark,rocketmq,rocketmq5}" \
    bash "${SCRIPTS}/python-deps.sh"
  step mariadb bash "${SCRIPTS}/mariadb.sh"
  step replica bash "${SCRIPTS}/mariadb-replica.sh"
  step galera bash "${SCRIPTS}/mariadb-galera.sh"
  step postgres bash "${SCRIPTS}/postgres.sh"
  step redis bash "${SCRIPTS}/redis.sh"
  step jdbc bash "${SCRIPTS}/jdbc.sh"
  step librocketmq bash "${SCRIPTS}/librocketmq.sh"
  step rocketmq bash "${SCRIPTS}/rocketmq.sh" start
  step rocketmq5 bash "${SCRIPTS}/rocketmq5.sh" start

  local jars
  jars=$(bash "${SCRIPTS}/jdbc.sh" jars 2>>"${LOG_DIR}/jdbc.log" 9>&-) \
    || { echo "setup: could not resolve the JDBC jars (see ${LOG_DIR}/jdbc.log)" >&2; exit 1; }
  local pg_url pg_url2
  pg_url=$(bash "${SCRIPTS}/postgres.sh" url ckit_test 2>>"${LOG_DIR}/postgres.log" 9>&-) \
    && pg_url2=$(bash "${SCRIPTS}/postgres.sh" url ckit_test2 2>>"${LOG_DIR}/postgres.log" 9>&-) \
    || { echo "setup: could not read the PostgreSQL port (see ${LOG_DIR}/postgres.log)" >&2; exit 1; }
  local primary_url replica_url
  primary_url=$(bash "${SCRIPTS}/mariadb-replica.sh" url primary 2>>"${LOG_DIR}/replica.log" 9>&-) \
    && replica_url=$(bash "${SCRIPTS}/mariadb-replica.sh" url replica 2>>"${LOG_DIR}/replica.log" 9>&-) \
    || { echo "setup: could not read the replica's URLs (see ${LOG_DIR}/replica.log)" >&2; exit 1; }
  local galera_url galera_url2
  galera_url=$(bash "${SCRIPTS}/mariadb-galera.sh" url 1 2>>"${LOG_DIR}/galera.log" 9>&-) \
    && galera_url2=$(bash "${SCRIPTS}/mariadb-galera.sh" url 2 2>>"${LOG_DIR}/galera.log" 9>&-) \
    || { echo "setup: could not read the Galera nodes' URLs (see ${LOG_DIR}/galera.log)" >&2; exit 1; }
  write_env "$jars" "$pg_url" "$pg_url2" "$primary_url" "$replica_url" "$galera_url" "$galera_url2"
  printf 'setup: wrote %s; all done in %ss\n' "${ENV_FILE#"$ROOT"/}" \
    "$(awk -v a="$total" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
}

main "$@"
