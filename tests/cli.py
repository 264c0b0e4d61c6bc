"""Helpers for tests of `ckit` from the outside: run it in a subprocess, read its error line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parent.parent


def ckit(*args: str, env: dict[str, str] | None = None, timeout: float = 180
         ) -> subprocess.CompletedProcess[str]:
    """Run `python -m consumer_kit.cli.main ARGS` on this tree and capture its output."""
    return subprocess.run([sys.executable, "-m", "consumer_kit.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def error_line(output: str) -> str:
    """The output of a failed command: exactly one line, starting with `error:`, no traceback."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


#: the environment `ckit` reads options from: a test of options must not see the shell's
CKIT_ENV = ("CKIT_DB_URL", "CKIT_TRANSPORT", "CKIT_MQ_PREFIX")


def without_ckit_env(monkeypatch: Any) -> None:
    """Remove `CKIT_ENV` for the test (`monkeypatch`: pytest's fixture)."""
    for name in CKIT_ENV:
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str) -> Result:
    """Run `ckit ARGS` in this process (typer's `CliRunner`)."""
    from consumer_kit.cli.main import app

    return CliRunner().invoke(app, list(args))
