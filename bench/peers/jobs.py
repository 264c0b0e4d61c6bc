"""Running one measure of one peer on one database: a subprocess in the peer's environment, the
job on stdin, progress on our stderr, the result parsed from its last stdout line; afterwards
every table of the job's prefix is dropped, also when the runner died or timed out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.peers.harness import RESULT_MARK

REPO = Path(__file__).resolve().parents[2]


@dataclass
class JobResult:
    """What one runner returned (or why it failed)."""

    peer: str
    label: str
    db: str
    measure: str
    seconds: float
    data: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def run(python: str, runner: str, job: dict[str, Any], *, peer: str, label: str,
        timeout: float) -> JobResult:
    """Run `bench.peers.runners.<runner>` under `python` with `job`; never raises for a runner
    failure (the report prints the error)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    sys.stderr.write(f"[{job['db']}] {label}: {job['measure']}\n")
    sys.stderr.flush()
    started = time.monotonic()
    result = JobResult(peer=peer, label=label, db=job["db"], measure=job["measure"], seconds=0.0)
    try:
        done = subprocess.run([python, "-m", f"bench.peers.runners.{runner}"],
                              input=json.dumps(job), stdout=subprocess.PIPE, stderr=None,
                              text=True, cwd=REPO, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        result.error = f"timed out after {timeout:.0f} s"
    else:
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_MARK)]
        if done.returncode == 0 and lines:
            result.data = json.loads(lines[-1][len(RESULT_MARK):])
        else:
            tail = [ln for ln in done.stdout.splitlines() if ln.strip()][-1:]
            result.error = f"exit {done.returncode}" + (f": {tail[0][:200]}" if tail else "")
    result.seconds = time.monotonic() - started
    drop_prefixed(job["url"], job["prefix"])
    return result


def drop_prefixed(url: str, prefix: str) -> None:
    """Drop every table whose name starts with `prefix` (the runner's, if it left any)."""
    engine = sa.create_engine(url)
    try:
        names = [n for n in sa.inspect(engine).get_table_names() if n.startswith(prefix)]
        if names:
            quote = engine.dialect.identifier_preparer.quote
            with engine.begin() as conn:
                for name in names:
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {quote(name)}")
            sys.stderr.write(f"  dropped {len(names)} table(s) left by the runner\n")
    finally:
        engine.dispose()
