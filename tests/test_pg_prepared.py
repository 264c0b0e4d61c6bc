"""consumer_kit.core.pg_prepared on the real PostgreSQL: a statement inside a begun transaction
(publish's outbox row) runs under the statement psycopg's cursor prepared for it, below the
cursor, only while psycopg holds that statement; written and refused as the cursor would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core.db import make_engine
from consumer_kit.core.driver_sql import execute
from consumer_kit.core.schema import build_metadata
from outbox_producer import Outbox
from tests.conftest import Db, database_url, unique_names
from tests.psycopg_cursors import CursorInserts

pytestmark = pytest.mark.postgresql


def _tables(engine: Engine) -> Iterator[Db]:
    names = unique_names("pp")
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(engine)
    try:
        yield Db(engine, names, "postgresql", str(engine.url))
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Db]:
    yield from _tables(make_engine(database_url("postgresql", tmp_path)))


def _publish(outbox: Outbox, conn: Connection, key: str) -> str:
    """`publish` in a transaction that did something first (so it is not the opening
    statement), committed."""
    with conn.begin():
        conn.exec_driver_sql("SELECT 1")
        return outbox.publish(conn, "ORDER_CREATED", {"n": key}, biz_type="order", biz_key=key)


def _warm(outbox: Outbox, conn: Connection) -> int:
    """Publish on `conn` until psycopg's cursor has prepared the INSERT; how many it took."""
    warm = _threshold(conn)
    for n in range(warm):
        _publish(outbox, conn, f"k{n}")
    return warm


def _threshold(conn: Connection) -> int:
    """How many cursor runs psycopg makes of a statement before it runs it prepared."""
    return int(conn.connection.dbapi_connection.prepare_threshold) + 1  # type: ignore[union-attr]


def _insert_names(conn: Connection) -> list[bytes]:
    """psycopg's names for the INSERTs it holds prepared on `conn`."""
    names = conn.connection.dbapi_connection._prepared._names  # type: ignore[union-attr]
    return [name for (query, _), name in names.items() if query.startswith(b"INSERT")]


def test_publish_runs_under_psycopgs_statement_once_psycopg_prepared_it(
        pg: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        cursor = CursorInserts(monkeypatch, conn)
        # Given: psycopg's cursor ran the INSERT until it prepared it
        warm = _warm(outbox, conn)
        assert cursor.count == warm and len(_insert_names(conn)) == 1
        # When: more publishes, with the cursor refusing INSERTs
        cursor.refuse = True
        for n in range(warm, warm + 4):
            _publish(outbox, conn, f"k{n}")
        # Then: written below the cursor, under psycopg's one statement (none of this path's)
        prepared = list(conn.exec_driver_sql(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'INSERT%%'").scalars())
        conn.commit()
        assert [name.encode() for name in prepared] == _insert_names(conn)
    assert pg.count(pg.names.outbox) == warm + 4


def test_a_duplicate_business_key_below_the_cursor_writes_nothing_and_answers_the_first_id(
        pg: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        cursor = CursorInserts(monkeypatch, conn)
        first = _publish(outbox, conn, "k0")
        _warm(outbox, conn)
        cursor.refuse = True
        # When: a key published before, below the cursor
        again = _publish(outbox, conn, "k0")
    # Then: the first message id, one row
    assert again == first
    assert pg.count(pg.names.outbox, "biz_key = 'k0'") == 1


@pytest.mark.parametrize("forget", ["rollback", "DISCARD ALL"])
def test_once_psycopg_forgets_its_statements_the_cursor_runs_the_insert_again(
        pg: Db, monkeypatch: pytest.MonkeyPatch, forget: str) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        cursor = CursorInserts(monkeypatch, conn)
        warm = _warm(outbox, conn)
        # Given: psycopg dropped every statement (a rollback sends DEALLOCATE ALL)
        if forget == "rollback":
            tx = conn.begin()
            conn.exec_driver_sql("SELECT 1")
            tx.rollback()
        else:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("DISCARD ALL")
            conn.commit()
            conn.execution_options(isolation_level="READ COMMITTED")
        assert _insert_names(conn) == []
        # When: the next publish
        _publish(outbox, conn, "after")
        # Then: the cursor ran it (no statement the server lost was used)
        assert cursor.count == warm + 1
    assert pg.count(pg.names.outbox) == warm + 1


def test_a_statement_dropped_behind_psycopgs_back_fails_its_transaction_and_is_prepared_anew(
        pg: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = Outbox(pg.engine, producer="orders", table=pg.names.outbox)
    with pg.engine.connect() as conn:
        cursor = CursorInserts(monkeypatch, conn)
        warm = _warm(outbox, conn)
        [name] = _insert_names(conn)
        # Given: that one statement deallocated where psycopg does not look
        conn.exec_driver_sql(f"DEALLOCATE {name.decode()}")
        conn.commit()
        # When / Then: the publish fails loudly, as psycopg's cursor would under that name...
        tx = conn.begin()
        conn.exec_driver_sql("SELECT 1")
        with pytest.raises(sa.exc.DBAPIError) as failed:
            outbox.publish(conn, "ORDER_CREATED", {}, biz_type="order", biz_key="lost")
        assert isinstance(failed.value.orig, psycopg.errors.InvalidSqlStatementName)
        # ...and psycopg is told to forget the name (before any rollback clears them all)
        assert _insert_names(conn) == []
        tx.rollback()
        # Then: the next publish goes through the cursor, which prepares it again later
        _publish(outbox, conn, "next")
        assert cursor.count == warm + 1
    assert pg.count(pg.names.outbox, "biz_key IN ('lost', 'next')") == 1


def test_without_prepared_statements_every_insert_stays_on_the_cursor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(database_url("postgresql", tmp_path),
                         connect_args={"prepare_threshold": None})
    for db in _tables(engine):
        outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
        with db.engine.connect() as conn:
            cursor = CursorInserts(monkeypatch, conn)
            for n in range(8):
                _publish(outbox, conn, f"k{n}")
            assert cursor.count == 8
        assert db.count(db.names.outbox) == 8


@pytest.fixture
def scratch(pg: Db) -> Iterator[str]:
    table = f"{pg.names.outbox}_scratch"
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, a text UNIQUE)")
    yield table
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


def test_a_duplicate_key_below_the_cursor_is_an_integrity_error_and_the_statement_stays(
        pg: Db, scratch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sql = f"INSERT INTO {scratch} (a) VALUES (%(a)s)"
    with pg.engine.connect() as conn:
        cursor = CursorInserts(monkeypatch, conn)
        warm = _threshold(conn)
        for n in range(warm):
            with conn.begin():
                conn.exec_driver_sql("SELECT 1")
                assert execute(conn, sql, {"a": f"v{n}"}) == 1
        cursor.refuse = True
        # When: a taken key, below the cursor
        with pytest.raises(sa.exc.IntegrityError), conn.begin():
            conn.exec_driver_sql("SELECT 1")
            execute(conn, sql, {"a": "v0"})
        # Then: SQLAlchemy's error, the connection alive; a new key written below the cursor
        assert not conn.invalidated
        cursor.refuse = False
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")
            assert execute(conn, sql, {"a": "new"}) == 1
    assert pg.count(scratch) == warm + 1


@pytest.mark.parametrize("statement", ["returning", "select", "call"])
def test_the_row_count_below_the_cursor_is_the_cursors_whatever_the_statement_answers(
        pg: Db, scratch: str, statement: str) -> None:
    # rows back (RETURNING, a SELECT) are counted; a command without a count (CALL) is -1
    sql = {"returning": f"INSERT INTO {scratch} (a) VALUES (%(a)s) RETURNING id",
           "select": f"SELECT a FROM {scratch} WHERE a <> %(a)s",
           "call": f"CALL {scratch}_p(%(a)s)"}[statement]
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO {scratch} (a) VALUES ('x'), ('y')")
        conn.exec_driver_sql(f"CREATE PROCEDURE {scratch}_p(a text) LANGUAGE sql AS 'SELECT 1'")
    try:
        with pg.engine.connect() as conn:
            warm = _threshold(conn)
            answers = []
            for n in range(warm + 2):  # the last ones below the cursor, under its statement
                with conn.begin():
                    conn.exec_driver_sql("SELECT 1")
                    answers.append(execute(conn, sql, {"a": f"v{n}"}))
            names = conn.connection.dbapi_connection._prepared._names  # type: ignore[union-attr]
            assert any(query.startswith(sql.split()[0].encode()) for query, _ in names)
    finally:
        with pg.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP PROCEDURE {scratch}_p(text)")
    assert answers == [{"returning": 1, "select": 2, "call": -1}[statement]] * (warm + 2)
