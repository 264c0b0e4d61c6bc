"""consumer_kit.core.pg_libpq on the real PostgreSQL: publish's and the processed row's INSERT
go below psycopg's cursor as a prepared statement (with psycopg's BEGIN in the same round trip
when they open the transaction), and stay right whatever makes psycopg forget its statements."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _refuse_cursor_inserts(monkeypatch: pytest.MonkeyPatch, conn: Connection) -> None:
    """psycopg's cursors of `conn` refuse INSERTs: only the path below them can write."""
    raw: Any = conn.connection.dbapi_connection
    made = raw.cursor

    class Refusing:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.inner = made(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            if str(query).lstrip().upper().startswith("INSERT"):
                raise AssertionError("an INSERT went through psycopg's cursor")
            return self.inner.execute(query, *args, **kwargs)

    monkeypatch.setattr(raw, "cursor", Refusing)


def test_publish_and_the_processed_row_go_below_the_cursor_as_prepared_statements(
        pg: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a connection whose psycopg cursors refuse INSERTs
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    store = ProcessedStore(pg.engine, "billing", table=pg.names.processed)
    with pg.engine.connect() as conn:
        _refuse_cursor_inserts(monkeypatch, conn)
        # When: a handler transaction claims a message first, then publishes, twice
        for n in (1, 2):
            with conn.begin():
                assert store.claim(conn, _message(f"m{n}"), ProcessedStatus.SUCCEEDED,
                                   receipt=True) is RowClaim.NEW
                _publish(outbox, conn, f"k{n}")
        # Then: two statements of ours, prepared once each and used again
        assert len(_ours(conn)) == 2
    assert pg.count(pg.names.outbox) == 2
    assert pg.count(pg.names.processed) == 2


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


def test_a_rolled_back_transaction_makes_psycopg_drop_it_and_the_next_publish_prepares_again(
        pg: Db) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        with conn.begin():
            _publish(outbox, conn, "k1")
            first = _ours(conn)
        # Given: a transaction that published, then rolled back (psycopg: DEALLOCATE ALL)
        tx = conn.begin()
        _publish(outbox, conn, "k2")
        tx.rollback()
        assert _ours(conn) == []
        # When: the connection publishes again
        with conn.begin():
            _publish(outbox, conn, "k3")
            again = _ours(conn)
    # Then: prepared again under a new name, and written
    assert len(first) == len(again) == 1 and first != again
    assert pg.count(pg.names.outbox) == 2


def test_discard_all_run_through_psycopg_is_followed_by_a_working_publish(pg: Db) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        with conn.begin():
            _publish(outbox, conn, "k1")
        # Given: DISCARD ALL (it drops every prepared statement of the session)
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("DISCARD ALL")
        conn.commit()
        conn.execution_options(isolation_level="READ COMMITTED")
        assert _ours(conn) == []
        # When / Then: publish prepares its statement again
        with conn.begin():
            _publish(outbox, conn, "k2")
    assert pg.count(pg.names.outbox) == 2


def test_psycopg_evicting_it_from_its_cache_deallocates_it_and_publish_prepares_again(
        pg: Db) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        raw.prepared_max = 1
        with conn.begin():
            _publish(outbox, conn, "k1")
            # Given: psycopg prepares a statement of its own past its limit of one
            cursor = raw.cursor()
            cursor.execute("SELECT 1 + %s", (1,), prepare=True)
            cursor.execute("SELECT 1", prepare=True)  # its cache maintenance runs after it
            assert _ours(conn) == []  # psycopg evicted and deallocated ours
            # When / Then: publish prepares it again
            _publish(outbox, conn, "k2")
            assert len(_ours(conn)) == 1
    assert pg.count(pg.names.outbox) == 2


@pytest.mark.parametrize("setting", ["prepare_threshold", "autocommit"])
def test_a_connection_without_prepared_statements_or_a_transaction_keeps_the_cursor(
        tmp_path: Path, setting: str) -> None:
    # Given: prepared statements turned off (a pooler that cannot keep them), or autocommit
    url = database_url("postgresql", tmp_path)
    engine = make_engine(url, connect_args={"prepare_threshold": None}) \
        if setting == "prepare_threshold" else make_engine(url, isolation_level="AUTOCOMMIT")
    for db in _tables(engine, "postgresql"):
        outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
        store = ProcessedStore(db.engine, "billing", table=db.names.processed)
        with db.engine.connect() as conn:
            # When
            with conn.begin():
                assert store.claim(conn, _message("m1"), ProcessedStatus.SUCCEEDED) \
                    is RowClaim.NEW
                _publish(outbox, conn, "k1")
            # Then: written, by the cursor (nothing of ours prepared)
            assert _ours(conn) == []
        assert db.count(db.names.outbox) == db.count(db.names.processed) == 1


@pytest.fixture
def scratch(pg: Db) -> Iterator[str]:
    table = f"{pg.names.outbox}_scratch"
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, "
                             "a text UNIQUE, b bytea, c timestamp)")
    yield table
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


def test_a_value_libpq_would_cut_at_nul_goes_to_the_cursor_which_refuses_it(
        pg: Db, scratch: str) -> None:
    sql = f"INSERT INTO {scratch} (a) VALUES (%(a)s)"
    with pg.engine.connect() as conn:
        with conn.begin():
            execute(conn, sql, {"a": "first"})
        # When / Then: psycopg's own error, nothing written with the text cut short
        with conn.begin(), pytest.raises(sa.exc.DataError, match="NUL"):
            execute(conn, sql, {"a": "cut\x00here"})
    with pg.engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT a FROM {scratch}").scalars().all() == ["first"]


def test_bytes_and_times_round_trip_and_returning_answers_an_int(pg: Db, scratch: str) -> None:
    import datetime as dt

    when = dt.datetime(2026, 11, 27, 12, 30, 1, 250)
    body = bytes(range(256))  # NUL and every other byte: sent in bytea's binary form
    sql = (f"INSERT INTO {scratch} (a, b, c) VALUES (%(a)s, %(b)s, %(c)s) RETURNING id")
    with pg.engine.connect() as conn:
        with conn.begin():
            found = execute(conn, sql, {"a": "x", "b": body, "c": when}, "scalar")
            assert len(_ours(conn)) == 1
        row = conn.exec_driver_sql(f"SELECT id, b, c FROM {scratch}").one()
    assert isinstance(found, int) and found == row.id
    assert bytes(row.b) == body and row.c == when


def test_a_duplicate_key_opening_the_transaction_is_an_integrity_error_and_the_connection_lives(
        pg: Db, scratch: str) -> None:
    sql = f"INSERT INTO {scratch} (a) VALUES (%(a)s)"
    with pg.engine.connect() as conn:
        with conn.begin():
            execute(conn, sql, {"a": "taken"})
        # When: the same key, as the first statement (sent with BEGIN)
        with pytest.raises(sa.exc.IntegrityError), conn.begin():
            execute(conn, sql, {"a": "taken"})
        # Then: the connection is not invalidated, and the next statement runs
        assert not conn.invalidated
        with conn.begin():
            execute(conn, sql, {"a": "next"})
    assert pg.count(scratch) == 2


def test_an_interrupt_half_way_through_closes_the_connection_and_sqlalchemy_drops_it(
        pg: Db, scratch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api: Any = pg_libpq._psycopg()
    real = api.generators

    class Interrupted:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def send(pgconn: Any) -> Any:
            raise KeyboardInterrupt

    sql = f"INSERT INTO {scratch} (a) VALUES (%(a)s)"
    with pg.engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        # Given: an interrupt once the pipeline's commands are queued
        monkeypatch.setattr(api, "generators", Interrupted())
        with pytest.raises(KeyboardInterrupt), conn.begin():
            execute(conn, sql, {"a": "lost"})
        monkeypatch.undo()
        # Then: the psycopg connection is closed, SQLAlchemy's invalidated
        assert raw.closed and conn.invalidated
    with pg.engine.begin() as conn:  # the pool hands out a working one
        execute(conn, sql, {"a": "next"})
    assert pg.count(scratch) == 1
