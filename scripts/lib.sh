#!/usr/bin/env bash
# Shared helpers for the project's scripts: logging, bounded waits, port checks and idempotent
# Debian package installs.
# Source it after setting LOG_TAG:   LOG_TAG=redis; source "${SCRIPTS}/lib.sh"

log() { printf '[%s] %s\n' "${LOG_TAG:-ckit}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# Print the script's header comment (from line 2 to `set -euo pipefail`) as its usage.
usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0" >&2; }

# wait_until WHAT DEADLINE CMD...: run CMD every 0.25 s until it succeeds. DEADLINE is a value of
# $SECONDS (shared by several waits) or +N for N seconds from now. On timeout it logs "timed out
# waiting for WHAT" and returns 1, so the caller can show its logs before dying:
#   wait_until "the server" "+${TIMEOUT}" alive || { show_logs; die "did not start"; }
wait_until() {
  local what=$1 deadline=$2
  shift 2
  [[ $deadline == +* ]] && deadline=$((SECONDS + ${deadline#+}))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      log "timed out waiting for ${what}"
      return 1
    fi
    sleep 0.25
  done
}

# port_open PORT: true when 127.0.0.1:PORT accepts TCP connections (gives up after 2 s).
port_open() {
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

need_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (apt-get needs it)"
}

pkg_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# True when the package lists know a candidate version for every given package.
apt_knows() {
  local out
  out=$(apt-cache policy "$@" 2>/dev/null) || return 1
  (($(grep -c '^ *Candidate: [^(]' <<<"$out") == $#))
}

# apt-get install the given packages when any is missing; `apt-get update` only when the
# package lists do not know them (fresh machine) or an install fails on stale lists.
apt_install() {
  local missing=() pkg
  for pkg in "$@"; do
    pkg_installed "$pkg" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) -eq 0 ]] || die "packages missing (${missing[*]}) and not root: cannot apt-get"
  local apt=(apt-get -o DPkg::Lock::Timeout=600 -y -q)
  export DEBIAN_FRONTEND=noninteractive
  if ! apt_knows "${missing[@]}"; then
    log "apt-get update"
    "${apt[@]}" update >&2
  fi
  log "apt-get install ${missing[*]}"
  if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2; then
    log "install failed; refreshing package lists and retrying once"
    "${apt[@]}" update >&2
    "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2
  fi
}

# private_mysqld_conf SERVER_ID PORT DIR: the [mysqld] section of a private MariaDB instance on
# 127.0.0.1:PORT with its socket, pid file, data and error log in DIR (the replica's source and
# replica, the Galera node); the caller appends its own lines.
private_mysqld_conf() {
  cat <<EOF
[mysqld]
server_id               = $1
port                    = $2
bind-address            = 127.0.0.1
socket                  = $3/mysqld.sock
pid-file                = $3/mysqld.pid
datadir                 = $3/data
log_error               = $3/error.log
skip-name-resolve
innodb_buffer_pool_size = 64M
max_connections         = 100
character-set-server    = utf8mb4
collation-server        = utf8mb4_general_ci
EOF
}
