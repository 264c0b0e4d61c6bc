"""consumer_kit.core.pg_libpq on the real PostgreSQL: the statement that opens a transaction (the
processed row) goes with psycopg's BEGIN in one round trip, as a prepared statement, written and
refused exactly as the cursor would, and mended when the server dropped the statement or holds
it already."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core import pg_libpq
from consumer_kit.core.db import make_engine
from consumer_kit.core.driver_sql import execute
from consumer_kit.core.schema import ProcessedStatus, build_metadata
from consumer_kit.message import Message
from consumer_kit.processed import ProcessedStore, RowClaim
from outbox_producer import Outbox
from tests.conftest import Db, database_url, unique_names
from tests.psycopg_cursors import CursorInserts

pytestmark = pytest.mark.postgresql


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Db]:
    yield from _tables(make_engine(database_url("postgresql", tmp_path)), "postgresql")


def _tables(engine: Engine, kind: str) -> Iterator[Db]:
    names = unique_names("lq")
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(engine)
    try:
        yield Db(engine, names, kind, str(engine.url))
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def _message(message_id: str) -> Message:
    return Message(id=message_id, topic="ORDER_CREATED", tags="created", keys=(), body=b"{}",
                   properties={}, reconsume_times=0, broker_message_id="b-" + message_id,
                   producer="orders")


def _ours(conn: Connection) -> list[str]:
    """The names of this module's prepared statements on `conn`'s server session (a
    transaction this begins is committed: psycopg's rollback would deallocate them)."""
    began = not conn.in_transaction()
    names = list(conn.exec_driver_sql(
        "SELECT name FROM pg_prepared_statements WHERE starts_with(name, '_ckit_') "
        "ORDER BY name").scalars())
    if began:
        conn.commit()
    return names


def _publish(outbox: Outbox, conn: Connection, key: str) -> str:
    return outbox.publish(conn, "ORDER_CREATED", {"n": key}, biz_type="order", biz_key=key)


def _claim(store: ProcessedStore, conn: Connection, message_id: str) -> RowClaim:
    with conn.begin():
        return store.claim(conn, _message(message_id), ProcessedStatus.SUCCEEDED, receipt=True)


def test_the_processed_row_opening_the_transaction_goes_below_the_cursor_prepared_once(
        pg: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a connection whose psycopg cursors refuse INSERTs
    store = ProcessedStore(pg.engine, "billing", table=pg.names.processed)
    with pg.engine.connect() as conn:
        CursorInserts(monkeypatch, conn).refuse = True
        # When: three handler transactions claim a message first
        for n in (1, 2, 3):
            assert _claim(store, conn, f"m{n}") is RowClaim.NEW
        # Then: one statement of ours, prepared once and used again
        assert len(_ours(conn)) == 1
    assert pg.count(pg.names.processed) == 3


def test_a_statement_inside_a_begun_transaction_stays_on_the_cursor(pg: Db) -> None:
    # Given: a transaction that wrote a row first
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")
            # When: publish runs inside it
            _publish(outbox, conn, "k1")
        # Then: nothing of ours prepared (nothing to share a round trip with)
        assert _ours(conn) == []
    assert pg.count(pg.names.outbox) == 1


def test_the_statement_opening_a_transaction_carries_psycopgs_begin_and_its_isolation_level(
        tmp_path: Path) -> None:
    # Given: an engine whose transactions are SERIALIZABLE
    engine = make_engine(database_url("postgresql", tmp_path), isolation_level="SERIALIZABLE")
    for db in _tables(engine, "postgresql"):
        store = ProcessedStore(db.engine, "billing", table=db.names.processed)
        with db.engine.connect() as conn:
            tx = conn.begin()
            # When: the claim is the transaction's first statement
            assert store.claim(conn, _message("m1"), ProcessedStatus.SUCCEEDED) is RowClaim.NEW
            # Then: it ran inside a SERIALIZABLE transaction it began...
            level = conn.exec_driver_sql("SHOW transaction_isolation").scalar()
            assert level == "serializable"
            tx.rollback()
        # ...which its rollback undid
        assert db.count(db.names.processed) == 0


@pytest.mark.parametrize("drop", ["DISCARD ALL", "DEALLOCATE ALL", "twice", "psycopg's"])
def test_a_statement_the_server_dropped_is_prepared_again_in_the_claims_transaction(
        pg: Db, drop: str) -> None:
    store = ProcessedStore(pg.engine, "billing", table=pg.names.processed)
    with pg.engine.connect() as conn:
        assert _claim(store, conn, "m1") is RowClaim.NEW
        # Given: the server session loses the statement behind the module's back
        if drop == "psycopg's":  # psycopg prepared statements of its own; a rollback drops all
            cursor: Any = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            cursor.execute("SELECT 1 + %s", (1,), prepare=True)
            conn.commit()
            tx = conn.begin()
            conn.exec_driver_sql("SELECT 1")
            tx.rollback()
        else:
            for n in range(2 if drop == "twice" else 1):
                if n:  # psycopg looks at a repeated DISCARD ALL no more; it drops ours again
                    assert _claim(store, conn, "m-between") is RowClaim.NEW
                    assert len(_ours(conn)) == 1
                conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.exec_driver_sql("DISCARD ALL" if drop == "twice" else drop)
                conn.commit()
                conn.execution_options(isolation_level="READ COMMITTED")
        assert _ours(conn) == []
        # When: the next claim opens its transaction
        assert _claim(store, conn, "m2") is RowClaim.NEW
        # Then: written, the statement prepared again
        assert len(_ours(conn)) == 1
    assert pg.count(pg.names.processed, "message_id IN ('m1', 'm2')") == 2


def test_a_statement_the_server_holds_already_is_used_as_it_is(pg: Db) -> None:
    store = ProcessedStore(pg.engine, "billing", table=pg.names.processed)
    with pg.engine.connect() as conn:
        assert _claim(store, conn, "m1") is RowClaim.NEW
        # Given: the module forgot it prepared it (the server still holds it)
        pg_libpq._prepared.pop(conn.connection.dbapi_connection)
        # When / Then: the PREPARE finds it there; the claim is written with it
        assert _claim(store, conn, "m2") is RowClaim.NEW
        assert len(_ours(conn)) == 1
    assert pg.count(pg.names.processed) == 2


@pytest.mark.parametrize("setting", ["prepare_threshold", "autocommit", "client cursor"])
def test_a_connection_without_prepared_statements_or_a_transaction_keeps_the_cursor(
        tmp_path: Path, setting: str) -> None:
    # Given: prepared statements turned off (a pooler that cannot keep them), client-side
    # binding, or autocommit
    url = database_url("postgresql", tmp_path)
    engine = {
        "prepare_threshold": lambda: make_engine(url, connect_args={"prepare_threshold": None}),
        "client cursor": lambda: make_engine(
            url, connect_args={"cursor_factory": psycopg.ClientCursor}),
        "autocommit": lambda: make_engine(url, isolation_level="AUTOCOMMIT"),
    }[setting]()
    for db in _tables(engine, "postgresql"):
        store = ProcessedStore(db.engine, "billing", table=db.names.processed)
        with db.engine.connect() as conn:
            # When
            for n in (1, 2):
                assert _claim(store, conn, f"m{n}") is RowClaim.NEW
            # Then: written, by the cursor (nothing of ours prepared)
            assert _ours(conn) == []
        assert db.count(db.names.processed) == 2


@pytest.fixture
def scratch(pg: Db) -> Iterator[str]:
    table = f"{pg.names.outbox}_scratch"
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, "
                             "a text UNIQUE, b bytea, c timestamp, j json, s smallint)")
    yield table
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


def _insert_first(conn: Connection, scratch: str, **values: Any) -> Any:
    """`values` inserted into `scratch` as the first statement of a transaction."""
    columns = ", ".join(values)
    params = ", ".join(f"%({c})s" for c in values)
    with conn.begin():
        return execute(conn, f"INSERT INTO {scratch} ({columns}) VALUES ({params})", values)


def test_values_are_written_and_refused_as_the_cursor_writes_and_refuses_them(
        pg: Db, scratch: str, tmp_path: Path) -> None:
    import datetime as dt

    when = dt.datetime(2026, 11, 27, 12, 30, 1, 250)
    body = bytes(range(256))  # NUL and every other byte
    cursor_only = make_engine(database_url("postgresql", tmp_path),
                              connect_args={"prepare_threshold": None})
    wrong: list[dict[str, Any]] = [
        {"a": "nul", "j": 5}, {"a": "nul\x00"}, {"a": "bytes", "s": b"\x00\xff"},
        {"a": "huge", "s": 10 ** 5000},
    ]
    try:
        with pg.engine.connect() as conn:
            assert _insert_first(conn, scratch, a="x" * 3 + "\u263a", b=body, c=when,
                                 s=7) == 1
            assert len(_ours(conn)) == 1
            row = conn.exec_driver_sql(f"SELECT a, b, c, s FROM {scratch}").one()
            conn.commit()
            assert (row.a, bytes(row.b), row.c, row.s) == ("xxx\u263a", body, when, 7)
            # values the columns do not take fail with the cursor's own errors
            for values in wrong:
                with cursor_only.connect() as plain, pytest.raises(sa.exc.DBAPIError) as want:
                    _insert_first(plain, scratch, **values)
                with pytest.raises(sa.exc.DBAPIError) as got:
                    _insert_first(conn, scratch, **values)
                assert type(got.value) is type(want.value), values
                assert type(got.value.orig) is type(want.value.orig), values
    finally:
        cursor_only.dispose()


def test_a_duplicate_key_opening_the_transaction_is_an_integrity_error_and_the_connection_lives(
        pg: Db, scratch: str) -> None:
    with pg.engine.connect() as conn:
        _insert_first(conn, scratch, a="taken")
        # When: the same key, as the first statement (sent with BEGIN)
        with pytest.raises(sa.exc.IntegrityError):
            _insert_first(conn, scratch, a="taken")
        # Then: the connection is not invalidated, and the next statement runs
        assert not conn.invalidated
        _insert_first(conn, scratch, a="next")
    assert pg.count(scratch) == 2


def test_an_interrupt_half_way_through_ends_the_connection_and_sqlalchemy_drops_it(
        pg: Db, scratch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api: Any = pg_libpq._psycopg()
    real = api.generators

    class Interrupted:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def send(pgconn: Any) -> Any:
            raise KeyboardInterrupt

    with pg.engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        # Given: an interrupt once the pipeline's commands are queued
        monkeypatch.setattr(api, "generators", Interrupted())
        with pytest.raises(KeyboardInterrupt):
            _insert_first(conn, scratch, a="lost")
        monkeypatch.undo()
        # Then: the psycopg connection is closed, SQLAlchemy's invalidated
        assert raw.closed and conn.invalidated
    with pg.engine.connect() as conn:  # the pool hands out a working one
        _insert_first(conn, scratch, a="next")
    assert pg.count(scratch) == 1


def test_a_command_without_a_count_opening_the_transaction_answers_the_cursors_minus_one(
        pg: Db, scratch: str) -> None:
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE PROCEDURE {scratch}_p(a text) LANGUAGE sql AS 'SELECT 1'")
    try:
        with pg.engine.connect() as conn:
            answers = []
            for _ in range(3):  # prepared by this path on the first, used as it is after
                with conn.begin():
                    answers.append(execute(conn, f"CALL {scratch}_p(%(a)s)", {"a": "v"}))
            assert _ours(conn)
    finally:
        with pg.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP PROCEDURE {scratch}_p(text)")
    assert answers == [-1, -1, -1]  # the cursor's rowcount when the command has no count
