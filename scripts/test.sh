#!/usr/bin/env bash
# Set up everything and run the whole test suite: the one command for developers and CI.
#
# usage: scripts/test.sh [PYTEST_ARGS...]
#
# Runs scripts/setup.sh, loads .ckit-test.env, then `ruff check .`, `mypy`, `lint-imports` (the
# import contracts; all configured in pyproject.toml) and `python -m pytest -q -ra PYTEST_ARGS...`
# from the repo root. All run; the exit code is pytest's, or 1 when pytest passed but a check
# failed.
# Environment: PYTHON (interpreter, default python3); CI=true turns "service not up" skips into
#   failures (see tests/services.py).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly ROOT
readonly PYTHON=${PYTHON:-python3}

case ${1:-} in
  -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
esac

cd "$ROOT"
bash scripts/setup.sh

set -a
# shellcheck source=/dev/null  # written by setup.sh
source "${ROOT}/.ckit-test.env"
set +a

failed=()

echo "== ruff check ."
"$PYTHON" -m ruff check . || failed+=(ruff)

echo "== mypy"
"$PYTHON" -m mypy || failed+=(mypy)

echo "== lint-imports (the layers of docs/architecture.md)"
"$PYTHON" -c "from importlinter.cli import lint_imports_command; lint_imports_command()" \
  || failed+=(lint-imports)

echo "== pytest -q -ra $*"
pytest_rc=0
"$PYTHON" -m pytest -q -ra "$@" || pytest_rc=$?

if ((${#failed[@]} > 0)); then
  echo "test.sh: FAILED: ${failed[*]} (pytest exit ${pytest_rc})" >&2
  ((pytest_rc != 0)) && exit "$pytest_rc"
  exit 1
fi
exit "$pytest_rc"
