"""The short fault scenario (bench/faults.py) on each transport, as a test: about 1,000 orders
while every fault kind happens at least once, on servers the run starts for itself (its own
MariaDB, Redis and RocketMQ on ports of their own: the shared services are never touched).

Needs the programs scripts/setup.sh installs (mariadbd, redis-server, and for RocketMQ a JVM
and the jars it caches); skipped locally without them, failed under CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.faults.schedule import kinds_for
from bench.faults.services import missing_programs
from tests import services

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 400  # bench/faults.py stops itself after 340 s


def programs(rocketmq: bool) -> None:
    missing = missing_programs(rocketmq)
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("transport", [
    pytest.param("sql", marks=[pytest.mark.mariadb, pytest.mark.redis]),
    pytest.param("rocketmq", marks=[pytest.mark.mariadb, pytest.mark.redis,
                                    pytest.mark.rocketmq]),
])
def test_a_short_fault_run_loses_no_order_and_applies_none_twice(
    transport: str, tmp_path: Path
) -> None:
    # Given: the server programs (the run starts its own servers with them)
    services.require(f"the programs for a {transport} fault run",
                     lambda: programs(transport == "rocketmq"))
    report_path = tmp_path / "report.json"

    # When: the short scenario runs with every fault kind of this transport
    proc = subprocess.run(
        [sys.executable, "bench/faults.py", "--transport", transport, "--seed", "12",
         "--dir", str(tmp_path / "run"), "--json", str(report_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)

    # Then: every invariant held, after every kind of fault
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert report_path.exists(), output
    report = json.loads(report_path.read_text())
    assert set(report["faults_by_kind"]) == set(kinds_for(transport)), output
    final = report["final"]
    assert final is not None, output
    assert (final["orders"], final["lost"], final["doubled"]) == (1000, 0, 0), output
    assert final["processed_ok"] == final["outbox_rows"] == final["states"]["CONSUMED"] == 1000, \
        output
    assert proc.stdout.strip().splitlines()[-1].startswith("ok: "), output
    assert proc.returncode == 0, output
