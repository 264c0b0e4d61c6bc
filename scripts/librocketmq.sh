#!/usr/bin/env bash
# Provision librocketmq.so for the installed rocketmq-client-python==2.0.0 (a ctypes wrapper that
# ships without its native library).
#
# usage: scripts/librocketmq.sh [install|check]   (default: install)
#
#   install  download the rocketmq-client-python==0.5.0rc2 manylinux wheel (which bundles
#            rocketmq/librocketmq.so and rocketmq/.libs/libz-*.so) into the cache once, copy both
#            next to the installed 2.0.0 package, and check that `from rocketmq.client import
#            Producer` works. Idempotent: a quick no-op when the library already loads.
#   check    only the import check (exit 1 when it fails)
#
# The bundled library is linked with RPATH $ORIGIN/.libs, so keeping the same layout (.so in the
# package folder, libz in its .libs/ subfolder) is all it needs. It is an older C++ client build
# (protocol V3_1_8); it speaks to a 4.9.x broker.
#
# Environment: CKIT_CACHE (default ~/.cache/consumer-kit), PYTHON (default python3).
set -euo pipefail

readonly WHEEL_VERSION=0.5.0rc2
readonly CACHE=${CKIT_CACHE:-$HOME/.cache/consumer-kit}
readonly WHEEL_DIR=${CACHE}/librocketmq-${WHEEL_VERSION}
readonly PYTHON=${PYTHON:-python3}

LOG_TAG=librocketmq
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

import_ok() {
  "$PYTHON" -c 'from rocketmq.client import Producer, PushConsumer' 2>/dev/null
}

package_dir() {
  # find_spec does not import the package (whose import fails while the library is missing).
  "$PYTHON" - <<'EOF'
import importlib.metadata as md
import importlib.util
import os
import sys

try:
    version = md.version("rocketmq-client-python")
except md.PackageNotFoundError:
    sys.exit("rocketmq-client-python is not installed: pip install 'consumer-kit[rocketmq]'")
if version != "2.0.0":
    print(f"warning: rocketmq-client-python {version} installed; this script targets 2.0.0",
          file=sys.stderr)
spec = importlib.util.find_spec("rocketmq")
if spec is None or not spec.origin:
    sys.exit("the rocketmq package cannot be found")
print(os.path.dirname(spec.origin))
EOF
}

download() {
  if compgen -G "${WHEEL_DIR}/rocketmq/librocketmq.so" >/dev/null; then
    return 0
  fi
  mkdir -p "${WHEEL_DIR}"
  log "downloading rocketmq-client-python==${WHEEL_VERSION} (manylinux1_x86_64) into ${WHEEL_DIR}"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --python-version 3 --implementation py --abi none \
    "rocketmq-client-python==${WHEEL_VERSION}" -d "${WHEEL_DIR}" >&2 \
    || die "pip download of rocketmq-client-python==${WHEEL_VERSION} failed"
  local wheel
  wheel=$(compgen -G "${WHEEL_DIR}/rocketmq_client_python-${WHEEL_VERSION}-*.whl" | head -1)
  [[ -n $wheel ]] || die "no wheel found in ${WHEEL_DIR}"
  "$PYTHON" - "$wheel" "${WHEEL_DIR}" <<'EOF'
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist()
             if n == "rocketmq/librocketmq.so" or n.startswith("rocketmq/.libs/")]
    if "rocketmq/librocketmq.so" not in names:
        sys.exit(f"{wheel} has no rocketmq/librocketmq.so")
    for name in names:
        zf.extract(name, dest)
EOF
}

provision() {
  if import_ok; then
    log "librocketmq already loads"
    return 0
  fi
  [[ $(uname -s) == Linux && $(uname -m) == x86_64 ]] \
    || die "the bundled librocketmq.so is for Linux x86_64 only; install librocketmq from the rocketmq-client-cpp releases"
  local pkg
  pkg=$(package_dir) || die "cannot locate the installed rocketmq package"
  download
  log "copying librocketmq.so and .libs/ into ${pkg}"
  install -m 0755 "${WHEEL_DIR}/rocketmq/librocketmq.so" "${pkg}/librocketmq.so"
  mkdir -p "${pkg}/.libs"
  local lib
  for lib in "${WHEEL_DIR}"/rocketmq/.libs/*; do
    install -m 0755 "$lib" "${pkg}/.libs/"
  done
  check
}

check() {
  if ! import_ok; then
    "$PYTHON" -c 'from rocketmq.client import Producer' >&2 || true
    die "rocketmq.client still does not import"
  fi
  log "ok: from rocketmq.client import Producer"
}

case "${1:-install}" in
  install) provision ;;
  check) check ;;
  *) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
esac
