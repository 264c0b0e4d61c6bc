"""Errors that waiting cannot fix are told from outages on each real database: a schema or a
trigger's refusal fails at once, a lock timeout or a killed connection is waited out. On
MariaDB the exception class cannot tell (PyMySQL raises OperationalError for both)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from consumer_kit.core.db_errors import is_duplicate, is_missing_table, is_transient
from tests.conftest import Db
from tests.poison import refused
from tests.producer.test_retention import publish


def raised(engine: sa.Engine, work: Callable[[sa.Connection], object]) -> exc.DBAPIError:
    """The database error `work` raises in a transaction of `engine`."""
    with pytest.raises(exc.DBAPIError) as error, engine.begin() as conn:
        work(conn)
    return error.value


def seed(db: Db) -> str:
    """One row in the outbox table (message id "m1"): the table's name."""
    [message_id] = publish(db, range(1))
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {db.names.outbox} SET message_id = 'm1' "
                             f"WHERE message_id = '{message_id}'")
    return db.names.outbox


def test_schema_and_trigger_errors_are_not_outages(db: Db) -> None:
    table = seed(db)
    dialect = db.engine.dialect.name
    unknown_column = raised(db.engine, lambda c: c.exec_driver_sql(
        f"UPDATE {table} SET no_such_column = 1"))
    no_table = raised(db.engine, lambda c: c.exec_driver_sql("SELECT * FROM no_such_table_x"))
    with refused(db.engine, table, "UPDATE", "message_id", "m1"):
        trigger = raised(db.engine, lambda c: c.exec_driver_sql(
            f"UPDATE {table} SET state = 1 WHERE message_id = 'm1'"))
    duplicate = raised(db.engine, lambda c: c.exec_driver_sql(
        f"INSERT INTO {table} SELECT * FROM {table}"))
    for error in (unknown_column, no_table, trigger, duplicate):
        assert not is_transient(error, dialect), error
    assert is_missing_table(no_table, dialect) and not is_missing_table(unknown_column, dialect)
    assert is_duplicate(duplicate, dialect) and not is_duplicate(trigger, dialect)


@pytest.mark.parametrize("kind", ["lock timeout", "killed connection", "statement timeout"])
def test_lock_and_statement_timeouts_and_killed_connections_are_outages(
        server_db: Db, kind: str) -> None:
    table = seed(server_db)
    engine = server_db.engine
    mysql = engine.dialect.name != "postgresql"
    with engine.connect() as holder, engine.connect() as victim:
        if kind == "lock timeout":
            holder.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
            victim.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1" if mysql
                                   else "SET lock_timeout = '200ms'")
        elif kind == "statement timeout":  # a query the server stopped, not the session
            holder.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
            victim.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 30, "
                                   "max_statement_time = 0.2" if mysql
                                   else "SET statement_timeout = '200ms'")
        else:
            pid = victim.exec_driver_sql("SELECT CONNECTION_ID()" if mysql
                                         else "SELECT pg_backend_pid()").scalar()
            victim.commit()
            holder.exec_driver_sql(f"KILL {pid}" if mysql
                                   else f"SELECT pg_terminate_backend({pid})")
        with pytest.raises(exc.DBAPIError) as error:
            victim.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
        holder.rollback()
    assert is_transient(error.value, engine.dialect.name), error.value


def test_a_busy_sqlite_database_is_an_outage(sqlite_db: Db) -> None:
    table = seed(sqlite_db)
    locked = sa.create_engine(sqlite_db.url, connect_args={"timeout": 0.1})
    with sqlite_db.engine.connect() as holder:
        holder.exec_driver_sql(f"UPDATE {table} SET state = 1")  # holds the write lock
        error = raised(locked, lambda c: c.exec_driver_sql(f"UPDATE {table} SET state = 2"))
        holder.rollback()
    locked.dispose()
    assert "locked" in str(error.orig) and is_transient(error, "sqlite")
