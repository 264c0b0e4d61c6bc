"""Configuration errors fail fast, before any row moves, and never cost a retry (issue 11, 1)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from consumer_kit import ConsumerApp
from consumer_kit.cli.main import app
from consumer_kit.core.clock import parse_duration
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import build_metadata, outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.sql import SqlTransport
from outbox_producer import Dispatcher, Outbox, Relay
from tests.cli import ROOT, ckit, error_line
from tests.conftest import Db


def producer_db(tmp_path: Path, rows: int = 3) -> str:
    """An outbox with `rows` PENDING messages; returns its URL."""
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    engine = make_engine(url)
    build_metadata(include_transport=False).create_all(engine)
    outbox = Outbox(engine, producer="orders")
    with engine.begin() as conn:
        for i in range(rows):
            outbox.publish(conn, "T", {"n": i}, biz_type="t", biz_key=str(i))
    engine.dispose()
    return url


def row_states(url: str) -> list[tuple[int, int]]:
    """(state, retry_count) of every outbox row."""
    engine = make_engine(url)
    table = outbox_table(sa.MetaData())
    with engine.connect() as conn:
        found = [(int(s), int(r)) for s, r in conn.execute(
            sa.select(table.c.state, table.c.retry_count).order_by(table.c.id))]
    engine.dispose()
    return found


PENDING_UNTOUCHED = [(int(OutboxState.PENDING), 0)] * 3


def needs_librocketmq() -> None:
    """Skip the test when the RocketMQ client's native library is not installed."""
    from consumer_kit.transports.rocketmq import native

    try:
        native.client()
    except ConfigError:
        pytest.skip("librocketmq is not installed (scripts/librocketmq.sh)")


# -- the relay -----------------------------------------------------------------------------------


def test_relay_with_the_transport_tables_missing_exits_2_and_moves_no_row(tmp_path: Path) -> None:
    # Given an outbox with due rows and a SQL transport whose tables were never created
    url = producer_db(tmp_path)
    # When
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport",
                                      f"sql+sqlite:///{tmp_path / 'mq.db'}", "--once"])
    # Then
    assert result.exit_code == 2
    assert "ckit db init" in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


def test_relay_refuses_a_transport_that_reaches_only_its_own_process(tmp_path: Path) -> None:
    url = producer_db(tmp_path)
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport", "memory://x",
                                      "--once"])
    assert result.exit_code == 2
    assert "cannot use memory://" in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


def test_a_running_relay_refuses_a_slow_retry_that_would_spin(tmp_path: Path) -> None:
    # Given a running relay (not --once) asked to retry FAILED rows at once
    url = producer_db(tmp_path)
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport",
                                      f"sql+sqlite:///{tmp_path / 'mq.db'}",
                                      "--retry-failed-after", "0s"])
    # Then one line before it starts: a refused row would be re-sent back to back
    assert result.exit_code == 2
    assert "--retry-failed-after" in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


@pytest.mark.parametrize(("option", "value"), [
    ("--max-rate", "inf"), ("--max-rate", "nan"), ("--max-rate", "-5"),
    ("--max-rate", "1e-10"),  # its wait overflowed the clock after the first send
    ("--lease", "inf"),
    ("--lease", "nan"), ("--lease", "-5s"), ("--lease", "0s"), ("--lease", "0.5s"),
    ("--retry-failed-after", "-1s"),
    ("--give-up-after", "nan"), ("--metrics-port", "99999"), ("--metrics-port", "0"),
    ("--batch", "0"), ("--shard", "5/4"), ("--idle-sleep", "0s"), ("--idle-sleep", "0.01s"),
    ("--shard", ""),  # `--shard "$SHARD"` unset: it served every shard's rows, without a word
])
def test_a_bad_relay_option_is_one_line_naming_it_before_any_row_moves(
        tmp_path: Path, option: str, value: str) -> None:
    url = producer_db(tmp_path)
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport",
                                      f"sql+sqlite:///{tmp_path / 'mq.db'}", "--once",
                                      option, value])
    assert result.exit_code == 2
    assert option in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


def test_a_metrics_port_already_taken_is_one_line_before_any_row_moves(tmp_path: Path) -> None:
    # Given a port another process listens on, and a transport that works
    url = producer_db(tmp_path)
    mq = f"sql+sqlite:///{tmp_path / 'mq.db'}"
    with SqlTransport(mq[4:], create_tables=True) as created:
        created.check()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # When
        result = CliRunner().invoke(app, ["relay", "--url", url, "--transport", mq, "--once",
                                          "--metrics-port", str(port)])
    # Then
    assert result.exit_code == 2
    assert f"--metrics-port {port}" in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


@pytest.mark.parametrize("text", ["inf", "nan", "-1s", "-0.5", "1e3", "10 minutes", ""])
def test_parse_duration_refuses_what_is_not_a_finite_positive_duration(text: str) -> None:
    with pytest.raises(ConfigError, match="--older-than"):
        parse_duration(text, option="--older-than")


def test_parse_duration_refuses_a_duration_no_date_can_be_computed_from() -> None:
    with pytest.raises(ConfigError, match=r"--older-than .* longer than 100 years"):
        parse_duration("99999999999d", option="--older-than")


def test_relay_once_ends_with_a_zero_slow_retry_and_a_row_that_always_fails(
        tmp_path: Path) -> None:
    # Given a FAILED row the transport refuses every time (over its size limit: stored before
    # publish knew the limit), and a slow retry of zero
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    engine = make_engine(url)
    build_metadata(include_transport=False).create_all(engine)
    outbox = Outbox(engine, producer="orders", max_body_bytes=64)
    with engine.begin() as conn:
        outbox.publish(conn, "T", "x" * 60, biz_type="t", biz_key="1")
    transport = SqlTransport(f"sqlite:///{tmp_path / 'mq.db'}", create_tables=True,
                             max_body_bytes=10)
    try:
        relay = Relay(engine, transport, failed_retry_after=dt.timedelta(0), idle_sleep=0.01)
        # When
        result = relay.run(once=True, max_batches=50)
    finally:
        transport.close()
    # Then it tried the row once (a loop would have run 50 batches)
    assert (result.batches, result.stats.failed) == (1, 1)
    assert row_states(url) == [(int(OutboxState.FAILED), 1)]


def test_ckit_relay_once_with_retry_failed_after_0s_ends(tmp_path: Path) -> None:
    # Given a row the SQL transport refuses every time (5 MiB: over its 4 MiB limit; published
    # through an outbox told the relay takes more)
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    engine = make_engine(url)
    build_metadata(include_transport=False).create_all(engine)
    with engine.begin() as conn:
        Outbox(engine, producer="orders", max_body_bytes=8 << 20).publish(
            conn, "T", b"x" * (5 << 20), biz_type="t", biz_key="big")
    engine.dispose()
    mq = f"sql+sqlite:///{tmp_path / 'mq.db'}"
    with SqlTransport(mq[4:], create_tables=True) as created:
        created.check()
    # When (a loop would run into the timeout)
    result = ckit("relay", "--url", url, "--transport", mq, "--once", "--retry-failed-after",
                  "0s", "--json", timeout=120)
    # Then it tried the row once and ended
    assert result.returncode == 0, result.stderr
    assert '"failed": 1' in result.stdout and '"batches": 1' in result.stdout
    assert row_states(url) == [(int(OutboxState.FAILED), 1)]


@pytest.mark.slow
def test_relay_once_with_the_broker_down_gives_up_with_exit_1_and_charges_no_retry(
        tmp_path: Path) -> None:
    needs_librocketmq()
    # Given due rows and a name server nobody listens on
    url = producer_db(tmp_path)
    # When
    result = ckit("relay", "--url", url, "--transport", "rocketmq://127.0.0.1:1", "--once",
                  "--give-up-after", "1s", timeout=120)
    # Then
    assert result.returncode == 1, result.stderr
    assert "error: gave up after --give-up-after 1s" in result.stderr
    assert row_states(url) == PENDING_UNTOUCHED


def test_relay_with_a_name_server_host_that_does_not_resolve_exits_2_and_moves_no_row(
        tmp_path: Path) -> None:
    needs_librocketmq()
    try:
        socket.getaddrinfo("nohost.invalid", 9876)
        pytest.skip("this machine's resolver finds an address for nohost.invalid")
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"this machine's resolver does not answer for .invalid names ({exc})")
    # Given due rows and a misspelt name-server host
    url = producer_db(tmp_path)
    # When
    result = ckit("relay", "--url", url, "--transport", "rocketmq://nohost.invalid:9876",
                  "--once", timeout=120)
    # Then one line before any row is claimed (the native client aborted the process from its
    # own thread, rows claimed, once a row was due)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(
        "error: RocketMQ name server host 'nohost.invalid' does not resolve")
    assert row_states(url) == PENDING_UNTOUCHED


def test_ckit_relay_once_gives_up_on_an_unreachable_sql_transport_after_give_up_after(
        tmp_path: Path) -> None:
    # Given an outbox and a SQL transport whose database does not answer (nothing listens)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    build_metadata(include_transport=False).create_all(make_engine(url))
    began = time.monotonic()
    # When a --once run is told to give up after 2 s
    result = ckit("relay", "--url", url, "--transport",
                  f"sql+mysql+pymysql://ckit:pw@127.0.0.1:{port}/x", "--once",
                  "--give-up-after", "2s", timeout=60)
    # Then it ends within about that, with one line (not after the transport's own 30 s)
    assert result.returncode != 0
    assert time.monotonic() - began < 20
    assert "unavailable for 2s" in error_line(result.stderr)


# -- the after-commit dispatcher -------------------------------------------------------------


def test_the_dispatcher_with_transport_tables_missing_logs_one_line_per_batch_and_keeps_rows(
        db: Db, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a dispatcher on a SQL transport whose tables were never created
    transport = SqlTransport(f"sqlite:///{tmp_path / 'mq.db'}")
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox).start()
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    caplog.set_level(logging.WARNING)
    try:
        # When two transactions publish five messages
        for keys in (range(3), range(3, 5)):
            with Session(db.engine) as session, session.begin():
                for n in keys:
                    outbox.publish(session, "T", {"n": n}, biz_type="t", biz_key=str(n))
            assert dispatcher.flush(30)
    finally:
        dispatcher.close()
        transport.close()
    # Then every row is PENDING for the relay, no retry counted
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT state, retry_count FROM {db.names.outbox}")).all()
    assert sorted((int(s), int(r)) for s, r in rows) == [(int(OutboxState.PENDING), 0)] * 5
    # and the log says so in one clear line per batch at most, without a traceback
    records = [r for r in caplog.records
               if r.levelno >= logging.WARNING and r.name == "outbox_producer.dispatcher"]
    assert 1 <= len(records) <= 2, [r.getMessage() for r in records]
    for record in records:
        assert record.exc_info is None
        assert "\n" not in record.getMessage()
        assert "ckit db init" in record.getMessage()


# -- drivers and paths -------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "hint"), [
    ("sql+mysql://u:pw@127.0.0.1/x", "use sql+mysql+pymysql://"),
    ("sql+postgresql://u:pw@127.0.0.1/x", "use sql+postgresql+psycopg://"),
])
def test_a_sql_transport_url_whose_driver_is_missing_names_the_one_to_use(
        url: str, hint: str) -> None:
    from consumer_kit.transports import open_transport

    with pytest.raises(ConfigError, match=re.escape(hint)) as exc:
        open_transport(url)
    assert "pw" not in str(exc.value)


@pytest.mark.parametrize(("url", "hint"), [
    ("mysql://u:pw@127.0.0.1/x", "use mysql+pymysql://"),
    ("mariadb://u:pw@127.0.0.1/x", "use mariadb+pymysql://"),
    ("mysql+mysqldb://u:pw@127.0.0.1/x", "use mysql+pymysql://"),
])
def test_a_url_whose_driver_is_missing_names_the_one_to_use(url: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(hint)):
        make_engine(url)
    result = CliRunner().invoke(app, ["db", "init", "--url", url])
    assert result.exit_code == 2
    assert hint in error_line(result.output)
    assert "pw" not in result.output


def test_postgresql_without_its_default_driver_names_an_installed_one_or_what_to_install(
        ) -> None:
    import importlib.util

    if importlib.util.find_spec("psycopg2"):
        pytest.skip("psycopg2 is installed: postgresql:// works as it is")
    installed = [m for m in ("psycopg", "pg8000") if importlib.util.find_spec(m)]
    hint = (f"use postgresql+{installed[0]}://" if installed
            else "pip install 'psycopg[binary]'")
    with pytest.raises(ConfigError, match=re.escape(hint)):
        make_engine("postgresql://u:pw@127.0.0.1/x")


def test_a_password_with_a_raw_at_sign_is_refused_instead_of_connecting_elsewhere() -> None:
    with pytest.raises(ConfigError, match="%40") as raised:
        make_engine("mysql+pymysql://u:p@ss@127.0.0.1/x")
    assert "p@ss" not in str(raised.value) and "ss@127" not in str(raised.value)


COMMANDS_WITH_A_DB = [
    ["db", "init", "--url", "{db}"],
    ["outbox", "stats", "--url", "{db}"],
    ["outbox", "show", "1", "--url", "{db}"],
    ["outbox", "archive", "--url", "{db}"],
    ["relay", "--url", "{db}", "--transport", "sql+sqlite:///{ok}/mq.db", "--once"],
    ["relay", "--url", "sqlite:///{ok}/orders.db", "--transport", "sql+{db}", "--once"],
    ["receipts", "--url", "{db}", "--producer", "orders", "--transport",
     "sql+sqlite:///{ok}/mq.db", "--burst"],
    ["processed", "purge", "--url", "{db}", "--group", "g"],
    ["mq", "purge", "--transport", "sql+{db}"],
    ["reconcile", "--url", "{db}", "-g", "inv=sqlite:///{ok}/inv.db", "--engine", "sql",
     "-o", ""],
    ["reconcile", "--url", "sqlite:///{ok}/orders.db", "-g", "inv={db}", "--engine", "sql",
     "-o", ""],
]


@pytest.mark.parametrize("args", COMMANDS_WITH_A_DB, ids=lambda a: " ".join(a[:2]))
def test_every_command_names_a_sqlite_folder_that_does_not_exist(
        tmp_path: Path, args: list[str]) -> None:
    # Given a SQLite URL in a folder that does not exist (the other databases are fine)
    missing = tmp_path / "no-such-folder"
    ok = tmp_path / "ok"
    ok.mkdir()
    producer_db(ok, rows=0)
    db = f"sqlite:///{missing / 'x.db'}"
    # When
    result = CliRunner().invoke(app, [a.format(db=db, ok=ok) for a in args])
    # Then
    assert result.exit_code == 2, result.output
    line = error_line(result.output)
    assert str(missing) in line and "does not exist" in line
    assert not missing.exists()


def test_outbox_consumer_app_and_make_engine_name_a_sqlite_folder_that_does_not_exist(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nope' / 'x.db'}"
    for make in (lambda: make_engine(url), lambda: Outbox(url, producer="orders"),
                 lambda: ConsumerApp(group="g", db=url, transport="memory://").engine):
        with pytest.raises(ConfigError, match=r"folder .*nope.* does not exist"):
            make()


def test_ckit_consume_names_the_missing_folder_of_its_apps_database(tmp_path: Path) -> None:
    env = {**os.environ, "INVENTORY_DB_URL": f"sqlite:///{tmp_path / 'nope' / 'inv.db'}",
           "CKIT_TRANSPORT": f"sql+sqlite:///{tmp_path / 'mq.db'}", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "consumer_kit.cli.main", "consume",
                             "examples.inventory:app", "--burst"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 2
    assert "does not exist" in error_line(result.stderr)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_ckit_consume_refuses_a_max_seconds_that_is_not_a_positive_finite_number(
        tmp_path: Path, value: str) -> None:
    # nan ran forever, -1 ended at once having consumed nothing, both exiting as if fine
    result = CliRunner().invoke(app, ["consume", "examples.inventory:app", "--transport",
                                      f"sql+sqlite:///{tmp_path / 'mq.db'}",
                                      f"--max-seconds={value}"])
    assert result.exit_code == 2
    assert "--max-seconds" in error_line(result.output)
    assert not (tmp_path / "mq.db").exists()  # refused before anything was opened


def test_relay_and_receipts_use_the_sql_transport_tables_named_by_mq_prefix(
        tmp_path: Path) -> None:
    # Given an outbox with 3 rows, and the SQL transport's tables made under another prefix
    url = producer_db(tmp_path)
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", mq, "--mq-prefix", "orders_mq"]
                              ).exit_code == 0
    # When the relay and the receipt consumer are given that prefix
    relay = CliRunner().invoke(app, ["relay", "--url", url, "--transport", f"sql+{mq}",
                                     "--mq-prefix", "orders_mq", "--once"])
    receipts = CliRunner().invoke(app, ["receipts", "--url", url, "--transport", f"sql+{mq}",
                                        "--mq-prefix", "orders_mq", "--producer", "orders",
                                        "--burst"])
    # Then they work on those tables (they could only use ckit_mq_*, which are not there)
    assert relay.exit_code == 0, relay.output
    assert receipts.exit_code == 0, receipts.output
    assert row_states(url) == [(int(OutboxState.SENT), 0)] * 3
    engine = make_engine(mq)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM orders_mq_message").scalar() == 3
    engine.dispose()


def test_an_mq_prefix_with_a_transport_that_is_not_sql_is_one_line_before_any_row_moves(
        tmp_path: Path) -> None:
    # Given an outbox with 3 due rows
    url = producer_db(tmp_path)
    # When the relay is given a prefix of SQL transport tables and a RocketMQ transport
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport",
                                      "rocketmq://127.0.0.1:9876", "--mq-prefix", "orders_mq",
                                      "--once"])
    # Then one line naming the option, and no row moved
    assert result.exit_code == 2
    assert "--mq-prefix 'orders_mq'" in error_line(result.output)
    assert row_states(url) == PENDING_UNTOUCHED


@pytest.mark.parametrize("schedule", [(), (float("inf"),), (1.0, float("nan")), (-1.0,)])
def test_a_back_off_step_that_is_not_a_finite_duration_is_refused(
        schedule: tuple[float, ...]) -> None:
    # an infinite step was taken, then raised OverflowError in the relay at the first failed
    # send; a NaN one made every retry due at once
    from outbox_producer import Backoff

    with pytest.raises(ConfigError, match="finite number of seconds"):
        Backoff(schedule=schedule)


@pytest.mark.parametrize(("option", "value"), [("queue_size", 0), ("queue_size", -5),
                                               ("max_batch", 0), ("max_batch", 2.5)])
def test_a_dispatcher_queue_or_batch_under_one_is_refused(
        tmp_path: Path, option: str, value: object) -> None:
    # a queue size of 0 or less made an unbounded queue (the back-pressure on publishers gone)
    from consumer_kit.transports.memory import MemoryTransport

    engine = make_engine(f"sqlite:///{tmp_path / 'orders.db'}")
    with pytest.raises(ConfigError, match=f"{option} must be a whole number >= 1"):
        Dispatcher(engine, MemoryTransport(), **{option: value})  # type: ignore[arg-type]
    engine.dispose()
