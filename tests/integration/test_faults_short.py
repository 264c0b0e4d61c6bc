"""The short fault scenario (bench/faults.py) on each transport, as a test: about 1,000 orders
while every fault kind happens at least once, on servers the run starts for itself (its own
MariaDB, Redis and RocketMQ 4.9.7 or 5.3.3 on ports of their own: the shared services are never
touched).

Needs the programs scripts/setup.sh installs (mariadbd, redis-server, and for RocketMQ a JVM
and the jars it caches; for RocketMQ 5 also the `rocketmq5` extra, rocketmq-python-client);
skipped locally without them, failed under CI.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.faults import postgres
from bench.faults.schedule import kinds_for
from bench.faults.services import missing_programs
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services

ROOT = Path(__file__).resolve().parents[2]
#: bench/faults.py stops itself after 340 s (rocketmq5: its 200 s window + 240 s)
RUN_TIMEOUT = {"sql": 400, "rocketmq": 400, "rocketmq5": 500}


def run_bounded(argv: list[str], timeout: float) -> tuple[str, str, int]:
    """Run the fault runner; past `timeout` send SIGTERM (it then stops the servers and
    processes it started) and, if it still runs a minute later, SIGKILL."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stderr += f"\n[the run passed {timeout:g}s and was stopped]"
    return stdout, stderr, proc.returncode


def programs(transport: str, db: str = "mariadb") -> None:
    missing = missing_programs(transport, db)
    if db == "postgresql":
        missing += postgres.missing_programs()
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}")
    if transport == "rocketmq5":  # the 5.x client (ConfigError with the pip command)
        RocketMQ5Transport("rocketmq5://127.0.0.1:1").check()


@pytest.mark.slow
@pytest.mark.timeout(max(RUN_TIMEOUT.values()) + 90)
@pytest.mark.parametrize(("transport", "claim", "redis_claims", "db"), [
    pytest.param("sql", "lease", "every", "mariadb",
                 marks=[pytest.mark.mariadb, pytest.mark.redis]),
    pytest.param("sql", "lock", "every", "mariadb",
                 marks=[pytest.mark.mariadb, pytest.mark.redis]),
    pytest.param("sql", "lease", "adaptive", "mariadb",
                 marks=[pytest.mark.mariadb, pytest.mark.redis]),
    pytest.param("sql", "lease", "every", "postgresql",
                 marks=[pytest.mark.postgresql, pytest.mark.redis]),
    pytest.param("rocketmq", "lease", "every", "mariadb",
                 marks=[pytest.mark.mariadb, pytest.mark.redis, pytest.mark.rocketmq]),
    pytest.param("rocketmq5", "lease", "every", "mariadb",
                 marks=[pytest.mark.mariadb, pytest.mark.redis, pytest.mark.rocketmq5]),
])
def test_a_short_fault_run_loses_no_order_and_applies_none_twice(
    transport: str, claim: str, redis_claims: str, db: str, tmp_path: Path
) -> None:
    # Given: the server programs (the run starts its own servers with them)
    services.require(f"the programs for a {transport} fault run on {db}",
                     lambda: programs(transport, db))
    report_path = tmp_path / "report.json"
    run_dir = tmp_path / "run"
    if db == "postgresql":  # its server runs as the postgres user: pytest's tmp is root's only
        run_dir = Path(tempfile.mkdtemp(prefix="ckit-faults-pg-"))
        run_dir.chmod(0o755)

    # When: the short scenario runs with every fault kind of this transport
    stdout, stderr, code = run_bounded(
        [sys.executable, "bench/faults.py", "--transport", transport, "--seed", "12",
         "--relay-claim", claim, "--redis-claims", redis_claims, "--db", db,
         "--dir", str(run_dir),
         "--json", str(report_path)],
        RUN_TIMEOUT[transport])

    if db == "postgresql":
        shutil.rmtree(run_dir, ignore_errors=True)

    # Then: every invariant held, after every kind of fault
    output = stdout[-6000:] + stderr[-3000:]
    assert report_path.exists(), output
    report = json.loads(report_path.read_text())
    assert set(report["faults_by_kind"]) == set(kinds_for(transport, db)), output
    assert report["title"].endswith(f"redis_claims {redis_claims}"), report["title"]
    final = report["final"]
    assert final is not None, output
    assert (final["orders"], final["lost"], final["doubled"]) == (1000, 0, 0), output
    assert final["processed_ok"] == final["outbox_rows"] == final["states"]["CONSUMED"] == 1000, \
        output
    assert stdout.strip().splitlines()[-1].startswith("ok: "), output
    assert code == 0, output
