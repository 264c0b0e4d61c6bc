"""`ckit reconcile` keeps passwords out of its summary, `summary.json`, `latest.json` and
samples, whatever they contain (issue 11, class 3), on SQLite and on real MariaDB."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.states import OutboxState
from tests.reconcile.conftest import World
from tests.test_secrets import assert_no_secret

ROOT = Path(__file__).resolve().parents[2]


def nasty(url: str) -> str:
    """The same database behind a URL full of password traps: SQLite ignores a password in
    the query string; MySQL drivers take the query's `password` over the userinfo one, so
    the userinfo carries a decoy with a space, an escaped `@`, `:` and `/`."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"{url}?password=Qx2sEcret&pwd=Pw3d"
    real = parsed.password or ""
    return (f"{parsed.drivername}://{parsed.username}:p%40ss w:rd/S3cr3t@{parsed.host}:"
            f"{parsed.port or 3306}/{parsed.database}?password={real}")


def test_reconcile_output_and_files_never_show_a_password(world: World, tmp_path: Path
                                                          ) -> None:
    # Given a lost receipt and a rejected row (so samples are written), behind nasty URLs
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    rejected = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", rejected, "FAILED", error="bad json")
    out = tmp_path / "out"
    producer, group = nasty(world.producer_url), nasty(world.group_urls["inventory"])
    # When
    result = subprocess.run(
        [sys.executable, "-m", "consumer_kit.cli.main", "-vv", "reconcile", "--url", producer,
         "--group", f"inventory={group}", "--processed-table", world.processed["inventory"].name,
         "--outbox-table", world.outbox.name, "--receipt-table", world.receipts.name,
         "--engine", "sql", "--output", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Then it worked through those URLs, and printed and wrote no password
    assert result.returncode == 3, result.stderr  # the rejected row alerts
    assert "receipt_lost" in result.stdout and "***" in result.stdout
    assert_no_secret(result.stdout + result.stderr)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "summary.json" for p in files)
    assert any(p.parent.name == "samples" for p in files)
    for path in files:
        assert_no_secret(path.read_text())
    if world.kind == "mariadb":
        real = sa.make_url(world.producer_url).password
        assert f"password={real}" not in result.stdout + "".join(p.read_text() for p in files)


@pytest.mark.mariadb
@pytest.mark.parametrize("kind", ["mariadb"])
def test_a_debug_spark_run_logs_no_py4j_command_with_the_jdbc_password(
        world: World, tmp_path: Path) -> None:
    # Given a stuck row on MariaDB, read by Spark over JDBC with the user's password
    world.add_processed("inventory", world.add_outbox(OutboxState.SENT))
    # When reconcile runs Spark at -vv
    result = subprocess.run(
        [sys.executable, "-m", "consumer_kit.cli.main", "-vv", "reconcile",
         "--url", world.producer_url, "--group", f"inventory={world.group_urls['inventory']}",
         "--processed-table", world.processed["inventory"].name,
         "--outbox-table", world.outbox.name, "--receipt-table", world.receipts.name,
         "--engine", "spark", "--dry-run", "--output", ""],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Then it ran with the log on (py4j's INFO lines are there), and without py4j's DEBUG wire
    # log (each command sent to the JVM: the JDBC properties' "password" and, on the next
    # line, its value)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "INFO py4j.clientserver" in result.stderr
    assert "DEBUG py4j" not in result.stderr and "Command to send" not in result.stderr
    assert "\nspassword\n" not in result.stderr
