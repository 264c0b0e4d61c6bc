#!/usr/bin/env bash
# Install the project editable with its dev, spark and rocketmq extras into the current Python.
#
# usage: scripts/python-deps.sh [--force]
#
# Skips pip when the installed distribution is already an editable install of THIS checkout at
# pyproject's version, with the same console scripts, every top-level package importing from here,
# and every requirement (base + extras) satisfied. --force always runs pip.
# Environment: PYTHON (interpreter, default python3), CKIT_PY_EXTRAS (default dev,spark,rocketmq).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly ROOT
readonly PYTHON=${PYTHON:-python3}
readonly EXTRAS=${CKIT_PY_EXTRAS:-dev,spark,rocketmq}
readonly LOCK=${TMPDIR:-/tmp}/ckit-python-deps.lock

LOG_TAG=python-deps
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Prints why the install is not up to date and exits 1, or exits 0 when it is.
up_to_date() {
  # Run from / so the checkout's own *.egg-info does not shadow the installed metadata.
  (cd / && "$PYTHON" - "$ROOT" "$EXTRAS" <<'PY'
import fnmatch
import importlib.metadata as md
import importlib.util
import json
import pathlib
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit("no TOML parser to read pyproject.toml")
from pip._vendor.packaging.requirements import Requirement

root = pathlib.Path(sys.argv[1]).resolve()
extras = [e for e in sys.argv[2].split(",") if e]
pyproject = tomllib.loads((root / "pyproject.toml").read_text())
project = pyproject["project"]

try:
    dist = md.distribution(project["name"])
except md.PackageNotFoundError:
    sys.exit(f"{project['name']} is not installed")
if dist.version != project["version"]:
    sys.exit(f"installed {dist.version}, pyproject says {project['version']}")
direct = json.loads(dist.read_text("direct_url.json") or "{}")
if not direct.get("dir_info", {}).get("editable") or direct.get("url") != root.as_uri():
    sys.exit(f"not an editable install of {root} (found {direct.get('url')})")
scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
if scripts != project.get("scripts", {}):
    sys.exit("console scripts changed")

reqs = list(project.get("dependencies", []))
for extra in extras:
    reqs += project.get("optional-dependencies", {}).get(extra, [])
for text in reqs:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(f"{req.name} is missing")
    if not req.specifier.contains(version, prereleases=True):
        sys.exit(f"{req.name} {version} does not satisfy {req.specifier}")

find = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
patterns = find.get("include", ["*"])
for pkg in sorted(root.iterdir()):
    if not (pkg / "__init__.py").is_file():
        continue
    if not any(fnmatch.fnmatchcase(pkg.name, p) for p in patterns):
        continue
    spec = importlib.util.find_spec(pkg.name)
    origin = pathlib.Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or pkg not in origin.parents:
        sys.exit(f"package {pkg.name} does not import from {pkg}")
PY
  )
}

main() {
  local force=0
  case ${1:-} in
    "") ;;
    --force) force=1 ;;
    -h | --help) usage; return 0 ;;
    *) usage; return 2 ;;
  esac
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip"

  # One pip at a time on this machine, even when several checkouts run setup together.
  exec 8>"$LOCK"
  flock -w 1800 8 || die "another pip install held $LOCK for 30 minutes"

  local why
  if ((!force)) && why=$(up_to_date 2>&1); then
    log "up to date ($("$PYTHON" --version 2>&1), editable from $ROOT)"
    return 0
  fi
  ((force)) && why="--force"
  log "installing -e .[${EXTRAS}] (${why})"
  (cd "$ROOT" && PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q \
    --disable-pip-version-check --no-input -e ".[${EXTRAS}]") || die "pip install failed"
  why=$(up_to_date 2>&1) || die "still not up to date after pip install: $why"
  log "installed"
}

main "$@"
