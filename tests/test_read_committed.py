"""`read_committed`: the relay's, dispatcher's, receipt applier's, archive's and rotate's
transactions run at READ COMMITTED on a pool they share with the caller's engine (an engine
whose own isolation option would win is refused), and a connection lost as that level is set
fails like any other statement does: SQLAlchemy's `OperationalError`, the connection discarded,
one line from the CLI (it used to be the driver's own error, let through unwrapped by the
engine option's connect hook)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.mysql.base import MySQLDialect
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.db import make_engine, read_committed
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipt import Receipt
from outbox_producer import Dispatcher, Outbox, Relay
from tests.cli import error_line
from tests.conftest import Db
from tests.producer.test_retention import consume, publish, remaining
from tests.recording import RecordingTransport

LEVEL = "SELECT @@tx_isolation"


@pytest.fixture
def kill_read_committed(mariadb: Db, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """KILL the server thread of the next connections (as many as the list's number says) just
    before READ COMMITTED is set on them: a connection lost after the pool's pre-ping. Only the
    test's own thread and its dispatcher's count (a thread another test left running is not
    this test's)."""
    killer = make_engine(mariadb.url)
    kills = [0]
    original = MySQLDialect.set_isolation_level
    test_thread = threading.current_thread()

    def kill_then_set(dialect: MySQLDialect, dbapi_connection: Any, level: str) -> None:
        thread = threading.current_thread()
        ours = thread is test_thread or thread.name == "ckit-dispatcher"
        if kills[0] > 0 and level == "READ COMMITTED" and ours:
            kills[0] -= 1
            with killer.connect() as conn:
                conn.exec_driver_sql(f"KILL {dbapi_connection.thread_id()}")
        original(dialect, dbapi_connection, level)

    monkeypatch.setattr(MySQLDialect, "set_isolation_level", kill_then_set)
    try:
        yield kills
    finally:
        killer.dispose()


@pytest.mark.mariadb
def test_read_committed_sets_the_level_on_its_connections_only(mariadb: Db) -> None:
    # Given an engine and its read_committed view, sharing one pool of one connection
    engine = make_engine(mariadb.url, pool_size=1, max_overflow=0)
    try:
        # When the same connection serves the view, then the engine
        with read_committed(engine).begin() as conn:
            inside = conn.exec_driver_sql(LEVEL).scalar()
        with engine.connect() as conn:
            after = conn.exec_driver_sql(LEVEL).scalar()
    finally:
        engine.dispose()
    # Then the view's transaction ran at READ COMMITTED and the connection went back reset
    assert (inside, after) == ("READ-COMMITTED", "REPEATABLE-READ")


@pytest.mark.mariadb
def test_a_connection_lost_as_the_level_is_set_raises_sqlalchemys_error_and_is_discarded(
        mariadb: Db, kill_read_committed: list[int]) -> None:
    # Given a read_committed engine whose next connection dies after the pool's pre-ping
    engine = make_engine(mariadb.url, pool_size=1, max_overflow=0)
    view = read_committed(engine)
    try:
        with engine.connect():
            pass  # the pool's one connection, alive
        kill_read_committed[0] = 1
        # When a transaction begins on it
        with pytest.raises(sa.exc.OperationalError) as lost, view.begin():
            pass
        # Then the error is SQLAlchemy's, and the next transaction gets a fresh connection
        with view.begin() as conn:
            level = conn.exec_driver_sql(LEVEL).scalar()
        status = engine.pool.status()
    finally:
        engine.dispose()
    assert lost.value.connection_invalidated
    assert "2013" in str(lost.value.orig)
    assert kill_read_committed == [0] and level == "READ-COMMITTED"
    assert "Checked out connections: 0" in status


@pytest.mark.mariadb
def test_the_archive_command_stopped_by_a_lost_connection_says_so_in_one_line(
        mariadb: Db, kill_read_committed: list[int]) -> None:
    # Given consumed rows to archive, and a database that drops archive's batch connection
    ids = publish(mariadb, range(3))
    Relay(mariadb.engine, RecordingTransport(), table=mariadb.names.outbox).run_once()
    consume(mariadb, [Receipt(m, "a") for m in ids])
    time.sleep(0.01)  # the rows' last change must be older than --older-than 1ms
    kill_read_committed[0] = 1
    args = ["outbox", "archive", "--url", mariadb.url, "--outbox-table", mariadb.names.outbox,
            "--receipt-table", mariadb.names.receipts, "--older-than", "1ms", "--force"]
    # When it runs
    stopped = CliRunner().invoke(app, args)
    # Then it says which database error stopped it, in one line, having moved nothing
    assert kill_read_committed == [0]
    assert stopped.exit_code == 2, stopped.output
    assert error_line(stopped.output).startswith(
        "error: database error: OperationalError: (2013, 'Lost connection"), stopped.output
    assert "Traceback" not in stopped.output and remaining(mariadb) == set(ids)
    # And running it again archives every row
    again = CliRunner().invoke(app, [*args, "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["moved"] == 3 and remaining(mariadb) == set()



@pytest.mark.mariadb
def test_a_dispatcher_whose_connection_is_lost_says_so_in_one_line_and_leaves_the_row_to_the_relay(
        mariadb: Db, kill_read_committed: list[int], caplog: pytest.LogCaptureFixture) -> None:
    # Given a dispatcher whose claim connection dies as it sets its isolation level
    transport = RecordingTransport()
    dispatcher = Dispatcher(mariadb.engine, transport, table=mariadb.names.outbox).start()
    outbox = Outbox(mariadb.engine, producer="orders", table=mariadb.names.outbox,
                    dispatcher=dispatcher)
    kill_read_committed[0] = 1
    try:
        # When a message is published
        with Session(mariadb.engine) as session, session.begin():
            message_id = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    # Then one warning names the outage, without a traceback, and nothing was sent
    said = [r for r in caplog.records if r.name == "outbox_producer.dispatcher"]
    assert kill_read_committed == [0] and transport.sent == []
    assert [(r.levelno, r.exc_info) for r in said] == [(logging.WARNING, None)], said
    assert said[0].getMessage().startswith(
        "dispatcher: transient database error; batch of 1 left for the relay "
        f"(first message {message_id}): OperationalError: (2013, 'Lost connection")
    # And the relay sends the row, once
    relayed = RecordingTransport()
    Relay(mariadb.engine, relayed, table=mariadb.names.outbox).run_once()
    assert relayed.counts() == {message_id: 1}


@pytest.mark.parametrize("level", ["AUTOCOMMIT", "SERIALIZABLE"])
def test_an_engine_with_its_own_isolation_level_is_refused_before_any_row_moves(
        server_db: Db, level: str) -> None:
    # Given a due row, and an engine whose execution option sets another isolation level (under
    # AUTOCOMMIT a lock-mode claim's row locks would end with its statement)
    [message_id] = publish(server_db, range(1))
    engine = server_db.engine.execution_options(isolation_level=level)
    transport = RecordingTransport()
    # When a relay or a dispatcher is built on it, then each is refused, naming the level
    for build in (lambda: Relay(engine, transport, table=server_db.names.outbox),
                  lambda: Dispatcher(engine, transport, table=server_db.names.outbox)):
        with pytest.raises(ConfigError, match=f"runs at isolation level {level}"):
            build()
    # And nothing was sent
    assert transport.sent == [] and remaining(server_db) == {message_id}
