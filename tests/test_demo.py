"""`ckit demo` runs the whole loop on embedded defaults and its summary adds up."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


def run_demo(tmp_path: Path, *args: str) -> tuple[int, dict[str, int], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "consumer_kit.cli.main", "demo", "--dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent,
    )
    counts = {m[1].strip(): int(m[2]) for m in re.finditer(r"^([a-z ()]+?)\s{2,}(\d+)\s",
                                                           proc.stdout, re.M)}
    return proc.returncode, counts, proc.stdout + proc.stderr


def test_the_demo_applies_each_effect_once_and_repairs_the_lost_ack(tmp_path: Path) -> None:
    code, counts, output = run_demo(tmp_path, "--engine", "sql", "--orders", "12")
    assert code == 0, output
    assert counts == {
        "published": 12, "sent by the relay": 12, "delivered": 15, "duplicates skipped": 3,
        "effects applied": 11, "rejected": 1, "consumed (receipts)": 10, "repaired": 1,
        "consumed (final)": 11,
    }, output
    assert "exactly once in effect" in output
    assert (tmp_path / "orders.db").exists() and (tmp_path / "mq.db").exists()


@pytest.mark.spark
def test_the_demo_reconciles_with_spark(tmp_path: Path) -> None:
    code, counts, output = run_demo(tmp_path, "--engine", "spark", "--orders", "6")
    assert code == 0, output
    assert counts["repaired"] == 1 and counts["consumed (final)"] == 5
    # Spark's own start-up noise stays out unless -v
    from tests.reconcile.test_reconcile_options import SPARK_NOISE

    assert not [n for n in SPARK_NOISE if n in output], output


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_the_demo_refuses_too_few_orders_and_a_folder_a_run_already_used(
        tmp_path: Path) -> None:
    # Given fewer orders than the duplicates and the lost receipt it injects, Then one line
    code, _, output = run_demo(tmp_path, "--orders", "3")
    assert code == 2 and "--orders" in output and "Traceback" not in output, output
    assert not (tmp_path / "orders.db").exists()
    # Given a folder holding a previous run's databases, Then one line, nothing touched
    (tmp_path / "orders.db").write_bytes(b"")
    code, _, output = run_demo(tmp_path, "--engine", "sql", "--orders", "4")
    assert code == 2 and "holds a demo run's orders.db" in output, output
    assert (tmp_path / "orders.db").read_bytes() == b""
