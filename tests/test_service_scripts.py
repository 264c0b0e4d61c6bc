"""The service scripts act only on the JVMs they started: a stale pid file never names a stranger.

A pid file left by an earlier machine (a reboot, a copied cache) may name a pid that another
process holds now, even the other RocketMQ's name server. The scripts used to take any JVM with
`org.apache.rocketmq` in its command line for their own: `start` then waited 150 s for a name
server it never launched, and `stop` killed the other RocketMQ's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import ROOT

SCRIPTS = {
    "rocketmq.sh": ("CKIT_ROCKETMQ_RUN", "namesrv", "org.apache.rocketmq.namesrv.NamesrvStartup"),
    "rocketmq5.sh": ("CKIT_ROCKETMQ5_RUN", "proxy", "org.apache.rocketmq.proxy.ProxyStartup"),
}


@pytest.fixture
def stranger(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command line reads like another run folder's RocketMQ JVM."""
    other = tmp_path / "someone-elses-run"
    argv = [sys.executable, "-c", "import time; time.sleep(60)", f"-Duser.home={other}"]
    proc = subprocess.Popen([*argv, *(cls for _, _, cls in SCRIPTS.values())])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def run_script(script: str, run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env_name = SCRIPTS[script][0]
    env = {**os.environ, env_name: str(run), "CKIT_ROCKETMQ_TIMEOUT": "5"}
    env["CKIT_ROCKETMQ5_TIMEOUT"] = "5"
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / script), *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def stale_pid_file(script: str, tmp_path: Path, stranger: subprocess.Popen[bytes]
                   ) -> tuple[Path, Path]:
    """A run folder whose pid file (of the script's checked JVM) names `stranger`."""
    run = tmp_path / "run"
    run.mkdir()
    pid_file = run / f"{SCRIPTS[script][1]}.pid"
    pid_file.write_text(f"{stranger.pid}\n")
    return run, pid_file


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_stop_never_signals_a_process_that_a_stale_pid_file_names(
    script: str, tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    run, pid_file = stale_pid_file(script, tmp_path, stranger)

    result = run_script(script, run, "stop")

    assert result.returncode == 0, result.stderr
    assert stranger.poll() is None, "stop killed a process it did not start"
    assert f"pid {stranger.pid}" not in result.stderr + result.stdout
    assert not pid_file.exists(), "the stale pid file stays behind"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_status_reports_down_when_the_pid_file_names_another_run_folders_jvm(
    script: str, tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    run, _ = stale_pid_file(script, tmp_path, stranger)

    result = run_script(script, run, "status")

    assert result.returncode == 1
    assert f"pid {stranger.pid}" not in result.stderr + result.stdout
