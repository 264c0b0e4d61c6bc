#!/usr/bin/env bash
# Run `ckit demo`: the whole loop on embedded defaults (SQLite, the SQL transport, no server).
#
# usage: scripts/demo.sh [ckit demo options, e.g. --orders 50 --dir ./demo]
#
# Installs the Python package (editable, with the Spark extra) and, when apt is usable, Debian's
# SQLite JDBC driver so the reconcile pass runs on Spark; without them it uses the SQL engine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
bash scripts/python-deps.sh >/dev/null
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  bash scripts/jdbc.sh >/dev/null 2>&1 || echo "demo: JDBC drivers not installed; reconciling with the SQL engine" >&2
fi
exec python3 -m consumer_kit.cli.main demo "$@"
