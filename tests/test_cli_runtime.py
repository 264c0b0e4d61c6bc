"""The long-running commands from the outside: relay, consume, acks, processed purge."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import build_metadata, outbox_table, processed_table
from consumer_kit.core.states import OutboxState
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import open_transport

ROOT = Path(__file__).resolve().parent.parent


def ckit(*args: str, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "consumer_kit.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_an_unknown_transport_scheme_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown transport URL 'kafka://x'"):
        open_transport("kafka://x")
    result = CliRunner().invoke(app, ["relay", "--url", "sqlite://", "--transport", "kafka://x"])
    assert result.exit_code == 2
    assert "unknown transport URL" in result.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_relay_finishes_its_batch_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'orders.db'}"
    build_metadata().create_all(make_engine(db))
    build_metadata().create_all(make_engine(f"sqlite:///{tmp_path / 'mq.db'}"))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer_kit.cli.main", "relay", "--url", db, "--transport",
         f"sql+sqlite:///{tmp_path / 'mq.db'}", "--json", "--metrics-port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # running and idle, its signal handlers installed (they come before the metrics server)
    assert wait_for(lambda: port_answers(port), 60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert '"sent": 0' in out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_relay_once_stopped_by_a_signal_before_it_drained_does_not_exit_0(
        tmp_path: Path, signum: signal.Signals) -> None:
    from outbox_producer import Outbox

    # Given 20 due rows, and a --once relay sending two a second
    db = f"sqlite:///{tmp_path / 'orders.db'}"
    build_metadata().create_all(make_engine(db))
    build_metadata().create_all(make_engine(f"sqlite:///{tmp_path / 'mq.db'}"))
    outbox = Outbox(db, producer="orders")
    with outbox.engine.begin() as conn:
        for i in range(20):
            outbox.publish(conn, "ORDERS", {"i": i}, biz_type="order", biz_key=str(i))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer_kit.cli.main", "relay", "--url", db, "--transport",
         f"sql+sqlite:///{tmp_path / 'mq.db'}", "--once", "--max-rate", "2", "--batch", "2",
         "--metrics-port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert wait_for(lambda: port_answers(port), 60)

    def pending() -> int:
        with outbox.engine.connect() as conn:
            return int(conn.scalar(sa.text("SELECT COUNT(*) FROM ckit_outbox WHERE state = 0")))

    assert wait_for(lambda: pending() < 20, 60)  # (on a loaded machine the port answers first)
    # When a signal stops it part way (a supervisor's SIGTERM, Ctrl-C)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    # Then its totals, one line saying it stopped before draining, and 128 + the signal: it
    # exited 0, which says "drained what was due" to the cron line or job that ran it
    assert proc.returncode == 128 + signum, (out, err)
    assert out.startswith("batches"), out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: stopped by {signum.name} before --once drained what was due"), err
    assert 0 < pending() < 20


def test_the_example_services_run_end_to_end_from_the_command_line(tmp_path: Path) -> None:
    # Given: the two example services on SQLite files and the SQL transport
    env = {"ORDERS_DB_URL": f"sqlite:///{tmp_path / 'orders.db'}",
           "INVENTORY_DB_URL": f"sqlite:///{tmp_path / 'inventory.db'}",
           "CKIT_TRANSPORT": f"sql+sqlite:///{tmp_path / 'mq.db'}",
           "PYTHONPATH": str(ROOT)}
    assert ckit("db", "init", "--url", f"sqlite:///{tmp_path / 'mq.db'}").returncode == 0
    subprocess.run([sys.executable, "-m", "examples.inventory"], check=True, cwd=ROOT,
                   env={**os.environ, **env}, timeout=60, capture_output=True)
    subprocess.run([sys.executable, "-m", "examples.orders", "4"], check=True, cwd=ROOT,
                   env={**os.environ, **env}, timeout=60, capture_output=True)
    # When
    consumed = ckit("consume", "examples.inventory:app", "--burst", env=env)
    acked = ckit("acks", "--url", env["ORDERS_DB_URL"], "--producer", "order-service",
                 "--burst", "--json", env=env)
    # Then
    assert consumed.returncode == 0, consumed.stderr
    assert "succeeded=4" in consumed.stdout
    assert acked.returncode == 0, acked.stderr
    assert '"consumed": 4' in acked.stdout
    engine = make_engine(env["ORDERS_DB_URL"])
    table = outbox_table(sa.MetaData())
    with engine.connect() as conn:
        states = set(conn.execute(sa.select(table.c.state)).scalars())
    assert states == {int(OutboxState.CONSUMED)}


def test_processed_purge_deletes_only_old_rows_of_the_group(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = make_engine(url)
    table = processed_table(sa.MetaData())
    table.create(engine)
    old, new = utcnow() - dt.timedelta(days=10), utcnow()
    with engine.begin() as conn:
        for mid, group, when in (("a", "inventory", old), ("b", "inventory", new),
                                 ("c", "billing", old)):
            conn.execute(sa.insert(table).values(
                consumer_group=group, message_id=mid, topic="T", status="SUCCEEDED",
                attempts=1, first_seen_at=when, processed_at=when))
    result = CliRunner().invoke(app, ["processed", "purge", "--url", url, "--group",
                                      "inventory", "--older-than", "7d"])
    assert result.exit_code == 0, result.output
    assert "deleted 1 processed rows" in result.output
    with engine.connect() as conn:
        left = sorted(conn.execute(sa.select(table.c.message_id)).scalars())
    assert left == ["b", "c"]


@pytest.mark.parametrize("group", ["", "  ", "g" * 129])
def test_processed_purge_refuses_a_group_that_names_no_consumer_group(
        tmp_path: Path, group: str) -> None:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    result = CliRunner().invoke(app, ["processed", "purge", "--url", url, "--group", group])
    assert result.exit_code == 2, result.output
    assert "--group must name a consumer group" in result.output
    assert not (tmp_path / "inv.db").exists()


def test_processed_purge_under_the_safety_floor_needs_force_and_keeps_owed_receipts(
        tmp_path: Path) -> None:
    # Given rows processed an hour ago, one of them still owing its receipt
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = make_engine(url)
    table = processed_table(sa.MetaData())
    table.create(engine)
    hour_ago = utcnow() - dt.timedelta(hours=1)
    with engine.begin() as conn:
        for mid, owed in (("done", None), ("owing", hour_ago)):
            conn.execute(sa.insert(table).values(
                consumer_group="inventory", message_id=mid, topic="T", status="SUCCEEDED",
                attempts=1, first_seen_at=hour_ago, processed_at=hour_ago, src="orders",
                receipt_due_at=owed))
    args = ["processed", "purge", "--url", url, "--group", "inventory", "--older-than", "0s"]
    # When purged under the floor, without and then with --force
    refused = CliRunner().invoke(app, args)
    forced = CliRunner().invoke(app, [*args, "--force"])
    # Then the first deleted nothing and said why in one line; the second kept the owing row
    assert refused.exit_code == 2 and "safety floor of 7 days" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert forced.exit_code == 0 and "deleted 1 processed rows" in forced.output
    with engine.connect() as conn:
        assert list(conn.execute(sa.select(table.c.message_id)).scalars()) == ["owing"]


def test_publish_then_consume_with_a_missing_processed_table_names_db_init(tmp_path: Path
                                                                            ) -> None:
    env = {"INVENTORY_DB_URL": f"sqlite:///{tmp_path / 'empty.db'}",
           "CKIT_TRANSPORT": f"sql+sqlite:///{tmp_path / 'mq.db'}", "PYTHONPATH": str(ROOT)}
    result = ckit("consume", "examples.inventory:app", "--burst", env=env)
    assert result.returncode == 2
    assert "ckit db init" in result.stderr
    assert "Traceback" not in result.stderr
