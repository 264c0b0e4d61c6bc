"""consumer_kit.core.driver_sql: publish's and the processed claim's one INSERT runs on the
driver's cursor only where SQLAlchemy would add nothing anyone can see, with the same errors."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import ProcessedStatus, build_metadata
from consumer_kit.message import Message
from consumer_kit.processed import ProcessedStore, RowClaim
from outbox_producer import Outbox
from tests import services
from tests.conftest import Db


def _no_sqlalchemy_inserts(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy refuses to execute any INSERT (Core or driver SQL: both go through
    `Connection._execute_context`); other statements run."""
    real = Connection._execute_context

    def refuse_inserts(self: Connection, dialect: Any, constructor: Any, statement: Any,
                       *args: Any, **kwargs: Any) -> Any:
        if str(statement).lstrip().upper().startswith("INSERT"):
            raise AssertionError("SQLAlchemy executed an INSERT: the driver's cursor was not "
                                 "used")
        return real(self, dialect, constructor, statement, *args, **kwargs)

    monkeypatch.setattr(Connection, "_execute_context", refuse_inserts)


def _message(message_id: str) -> Message:
    return Message(id=message_id, topic="ORDER_CREATED", tags="created", keys=(), body=b"{}",
                   properties={}, reconsume_times=0, broker_message_id="b-" + message_id,
                   producer="orders")


def test_publish_in_a_transaction_runs_on_the_drivers_cursor(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: SQLAlchemy refuses to execute INSERTs
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    _no_sqlalchemy_inserts(monkeypatch)
    # When
    with server_db.engine.begin() as conn:
        mid = outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="1")
        again = outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="1")
    # Then: written once, and the duplicate answered with the first id
    assert again == mid
    assert server_db.count(server_db.names.outbox) == 1


def test_the_processed_claim_runs_on_the_drivers_cursor_and_a_duplicate_is_done(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ProcessedStore(server_db.engine, "g1", table=server_db.names.processed)
    _no_sqlalchemy_inserts(monkeypatch)  # the duplicate's status look-up (a SELECT) still runs
    with server_db.engine.begin() as conn:
        assert store.claim(conn, _message("m-1"), ProcessedStatus.SUCCEEDED) is RowClaim.NEW
    with server_db.engine.connect() as conn:
        with conn.begin() as tx:
            assert store.claim(conn, _message("m-1"),
                               ProcessedStatus.SUCCEEDED) is RowClaim.TAKEN
            tx.rollback()
        assert store.decide(conn, _message("m-1")) is RowClaim.DONE
    assert server_db.count(server_db.names.processed) == 1


def test_publish_as_the_first_statement_of_a_connection_joins_the_transaction_it_begins(
        server_db: Db) -> None:
    # Given: a connection no statement has begun a transaction on yet
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    with server_db.engine.connect() as conn:
        assert not conn.in_transaction()
        # When: publish is its first statement, then the caller commits
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="c")
        assert conn.in_transaction()
        conn.commit()
    # Then: the commit wrote it (SQLAlchemy knew of the transaction)
    assert server_db.count(server_db.names.outbox) == 1
    with server_db.engine.connect() as conn:
        outbox.publish(conn, "ORDER_CREATED", {"n": 2}, biz_type="order", biz_key="r")
    # and closing without a commit rolled that one back
    assert server_db.count(server_db.names.outbox) == 1


def test_a_cursor_event_listener_sees_publishs_insert(server_db: Db) -> None:
    # Given: a listener, as a tracing or logging hook adds one
    seen: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(server_db.engine, "before_cursor_execute", listener)
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    try:
        with server_db.engine.begin() as conn:
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="e")
    finally:
        sa.event.remove(server_db.engine, "before_cursor_execute", listener)
    # Then: the statement went through SQLAlchemy, so the hook saw it
    assert any(server_db.names.outbox in s and s.lstrip().upper().startswith("INSERT")
               for s in seen)


def test_an_echoing_engine_logs_publishs_insert(server_db: Db,
                                               caplog: pytest.LogCaptureFixture) -> None:
    engine = make_engine(server_db.url, echo=True)
    outbox = Outbox(engine, producer="orders", table=server_db.names.outbox)
    try:
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine"), engine.begin() as conn:
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="l")
    finally:
        engine.dispose()
    assert any(server_db.names.outbox in r.getMessage() and "INSERT" in r.getMessage()
               for r in caplog.records)


def _kill(db: Db, victim: Connection) -> None:
    """End `victim`'s session from the server's side."""
    with db.engine.connect() as admin:
        if db.kind == "mariadb":
            session_id = victim.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            admin.exec_driver_sql(f"KILL CONNECTION {int(session_id or 0)}")
        else:
            session_id = victim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({int(session_id or 0)})")
        admin.commit()


def test_a_lost_connection_during_publish_raises_sqlalchemys_error_and_invalidates_it(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a transaction whose server session is killed before publish runs
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    with server_db.engine.connect() as conn:
        conn.begin()
        _kill(server_db, conn)
        # When: publish runs on the driver's cursor (SQLAlchemy would refuse the INSERT)
        with monkeypatch.context() as patched, pytest.raises(sa.exc.DBAPIError) as raised:
            _no_sqlalchemy_inserts(patched)
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="k")
        # Then: SQLAlchemy's error, the connection invalidated (not handed out again)
        assert raised.value.connection_invalidated
        assert conn.invalidated
    with server_db.engine.begin() as conn:  # the pool still works
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="k")
    assert server_db.count(server_db.names.outbox) == 1


def _cursors_failing_to_close(monkeypatch: pytest.MonkeyPatch, conn: Connection,
                              execute_error: Exception | None = None) -> list[str]:
    """Make `conn`'s driver hand out cursors whose close raises the driver's
    `OperationalError` (after closing), and whose execute raises `execute_error` when given;
    returns the list each close appends to."""
    raw = conn.connection.dbapi_connection
    error = conn.dialect.loaded_dbapi.OperationalError
    made = raw.cursor
    closes: list[str] = []

    class FailingClose:
        def __init__(self) -> None:
            self.inner = made()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def execute(self, *args: Any) -> Any:
            if execute_error is not None:
                raise execute_error
            return self.inner.execute(*args)

        def close(self) -> None:
            self.inner.close()
            closes.append("closed")
            raise error("the cursor could not be closed")

    monkeypatch.setattr(raw, "cursor", FailingClose)
    return closes


@contextlib.contextmanager
def _publishing_on_cursors_failing_to_close(
        db: Db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, *,
        commit: bool, execute_error: Exception | None = None,
) -> Iterator[tuple[Outbox, Connection, list[str]]]:
    """An outbox and a connection in a transaction whose driver cursors fail to close (see
    `_cursors_failing_to_close`; on PostgreSQL psycopg's prepared statements are off, so
    that `pg_libpq` leaves publish, the transaction's first statement here, to the cursor);
    inside the block publish runs on the driver's cursor (SQLAlchemy's INSERTs refused) and
    errors are logged to `caplog`. After it the cursors are the driver's again, and the
    transaction is committed or rolled back."""
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.connect() as conn:
        if db.kind == "postgresql":  # the cursor, not the prepared statement below it
            conn.connection.dbapi_connection.prepare_threshold = None  # type: ignore[union-attr]
        conn.begin()
        closes = _cursors_failing_to_close(monkeypatch, conn, execute_error=execute_error)
        with monkeypatch.context() as patched, caplog.at_level(logging.ERROR):
            _no_sqlalchemy_inserts(patched)
            yield outbox, conn, closes
        monkeypatch.undo()  # the commit's own statements get the driver's cursors again
        if commit:
            conn.commit()
        else:
            conn.rollback()


def test_a_driver_error_closing_the_cursor_after_publish_is_logged_as_sqlalchemy_does(
        server_db: Db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: a driver whose cursors fail to close after their statement ran
    with _publishing_on_cursors_failing_to_close(server_db, monkeypatch, caplog,
                                                 commit=True) as (outbox, conn, closes):
        # When: publish runs on the driver's cursor
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="c")
    # Then: as exec_driver_sql does, the close error is logged once and the row written
    assert closes == ["closed"]
    assert caplog.text.count("Error closing cursor") == 1
    assert "could not be closed" in caplog.text
    assert server_db.count(server_db.names.outbox) == 1


def test_an_error_not_the_drivers_during_publish_is_raised_as_it_is_and_a_close_error_logged(
        server_db: Db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given: a cursor whose execute raises an error of Python's (not the driver's), and whose
    # close then fails too
    with _publishing_on_cursors_failing_to_close(
            server_db, monkeypatch, caplog, commit=False,
            execute_error=ValueError("not the driver's")) as (outbox, conn, _), \
            pytest.raises(ValueError, match="not the driver's"):
        # When: publish runs on the driver's cursor
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="v")
    # Then: the error as it is (not wrapped), the close error logged, not lost
    assert caplog.text.count("Error closing cursor") == 1
    assert server_db.count(server_db.names.outbox) == 0


def test_publish_after_a_savepoint_rolled_back_inside_its_block_is_refused_as_sqlalchemy_does(
        server_db: Db) -> None:
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    with server_db.engine.connect() as conn, conn.begin(), conn.begin_nested() as savepoint:
        savepoint.rollback()
        with pytest.raises(sa.exc.InvalidRequestError, match="closed transaction"):
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="s")
    assert server_db.count(server_db.names.outbox) == 0


@pytest.fixture
def translated(server_db: Db) -> Iterator[tuple[sa.engine.Engine, str]]:
    """An engine whose tables live in another schema (MariaDB: the second test database;
    PostgreSQL: a schema of the test database), named by `schema_translate_map` only."""
    if server_db.kind == "mariadb":
        schema = sa.engine.make_url(services.mysql_url2()).database or ""
    else:
        schema = "tr_" + server_db.names.outbox[:9]
        with server_db.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine = server_db.engine.execution_options(schema_translate_map={None: schema})
    metadata = build_metadata(server_db.names, include_transport=False)
    try:
        with server_db.engine.begin() as conn:  # the untranslated tables are not there
            for table in (server_db.names.outbox, server_db.names.processed):
                conn.exec_driver_sql(f"DROP TABLE {table}")
        metadata.create_all(engine)
        yield engine, schema
        metadata.drop_all(engine)
    finally:
        if server_db.kind == "postgresql":
            with server_db.engine.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        with server_db.engine.begin() as conn:  # for the fixture's own drop_all
            build_metadata(server_db.names, include_transport=False).create_all(conn)


def test_a_schema_translate_map_names_the_table_publish_and_the_claim_write(
        server_db: Db, translated: tuple[sa.engine.Engine, str]) -> None:
    engine, schema = translated
    outbox = Outbox(engine, producer="orders", table=server_db.names.outbox)
    store = ProcessedStore(engine, "g1", table=server_db.names.processed)
    with engine.begin() as conn:
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="t")
        assert store.claim(conn, _message("m-t"), ProcessedStatus.SUCCEEDED) is RowClaim.NEW
    with engine.connect() as conn:
        for table in (server_db.names.outbox, server_db.names.processed):
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {schema}.{table}").scalar() == 1


def test_a_listener_on_the_engine_class_sees_publishs_insert_and_once_removed_the_cursor_runs(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a listener on every engine (the Engine class), as a test or an instrumentation adds
    seen: list[str] = []

    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", listener)
    try:
        with server_db.engine.begin() as conn:
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="a")
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", listener)
    # Then: it saw the INSERT
    assert any(server_db.names.outbox in s and s.lstrip().upper().startswith("INSERT")
               for s in seen)
    # And once it is gone (SQLAlchemy's flag stays set), publish is back on the cursor
    _no_sqlalchemy_inserts(monkeypatch)
    with server_db.engine.begin() as conn:
        outbox.publish(conn, "ORDER_CREATED", {"n": 2}, biz_type="order", biz_key="b")
    assert server_db.count(server_db.names.outbox) == 2
