"""Errors that waiting cannot fix are told from outages on each real database: a schema or a
trigger's refusal fails at once, a lock timeout or a killed connection is waited out. On
MariaDB the exception class cannot tell (PyMySQL raises OperationalError for both)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from consumer_kit.core.db_errors import (
    describe,
    is_conflict,
    is_duplicate,
    is_missing_table,
    is_transient,
)
from tests.conftest import DB_KINDS, Db
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


#: PostgreSQL through pg8000 as well (its SQLSTATE is in its first argument)
PG8000 = pytest.param("pg8000", marks=pytest.mark.postgresql)
#: every database, and PostgreSQL through pg8000
WITH_PG8000 = [*DB_KINDS, PG8000]
#: each database server, and PostgreSQL through pg8000
SERVERS_WITH_PG8000 = [pytest.param("mariadb", marks=pytest.mark.mariadb),
                       pytest.param("postgresql", marks=pytest.mark.postgresql), PG8000]


@pytest.mark.parametrize("db", WITH_PG8000, indirect=True)
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


@pytest.mark.parametrize("server_db", SERVERS_WITH_PG8000, indirect=True)
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


def lock_wait_timeout(db: Db, table: str) -> exc.DBAPIError:
    """A real lock wait timeout on `db`'s server: a row of `table` locked by one connection,
    then asked for by another that waits at most 1 s (MariaDB) or 200 ms (PostgreSQL)."""
    mysql = db.engine.dialect.name != "postgresql"
    with db.engine.connect() as holder, db.engine.connect() as victim:
        holder.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
        victim.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1" if mysql
                               else "SET lock_timeout = '200ms'")
        with pytest.raises(exc.DBAPIError) as caught:
            victim.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
        holder.rollback()
    return caught.value


def deadlock(db: Db) -> exc.DBAPIError:
    """A real deadlock on `db`'s server: two transactions each update one of two rows, then the
    other's. The error of the one the server rolled back."""
    [first, second] = publish(db, range(2))
    table = db.names.outbox
    update = f"UPDATE {table} SET retry_count = retry_count + 1 WHERE message_id = '{{}}'"
    errors: list[exc.DBAPIError] = []
    both_hold = threading.Barrier(2)

    def cross(mine: str, theirs: str) -> None:
        with db.engine.connect() as conn:
            try:
                conn.exec_driver_sql(update.format(mine))
                both_hold.wait(10)
                conn.exec_driver_sql(update.format(theirs))
                conn.commit()
            except exc.DBAPIError as error:
                errors.append(error)

    threads = [threading.Thread(target=cross, args=pair)
               for pair in ((first, second), (second, first))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize("server_db", SERVERS_WITH_PG8000, indirect=True)
def test_a_deadlock_is_a_conflict_to_run_again_and_a_lock_timeout_is_not(server_db: Db) -> None:
    # Given a real deadlock, and a real lock wait timeout, on the server
    dialect = server_db.engine.dialect.name
    lost = deadlock(server_db)
    timeout = lock_wait_timeout(server_db, seed(server_db))
    # Then the deadlock's transaction lost to the other and may run again at once; the
    # timeout is an outage to wait out, not a conflict; both are transient
    assert is_conflict(lost, dialect) and is_transient(lost, dialect), lost
    assert not is_conflict(timeout, dialect) and is_transient(timeout, dialect), timeout


def test_certification_conflicts_of_a_cluster_are_conflicts() -> None:
    # Galera's certification failure reaches the client as a deadlock (1213, produced in
    # tests/integration/test_galera_cluster.py); MySQL Group Replication's is 3101 (no such
    # server here: judged on the error PyMySQL raises for it). PostgreSQL's serialization
    # failure is one too; SQLite has none
    import psycopg
    import pymysql

    gr = pymysql.err.OperationalError(
        3101, "Plugin instructed the server to rollback the current transaction.")
    assert is_conflict(wrapped(gr, pymysql.err.Error), "mysql")
    assert is_conflict(wrapped(gr, pymysql.err.Error), "mariadb")
    assert not is_conflict(pymysql.err.OperationalError(2013, "Lost connection"), "mysql")
    serialization = psycopg.errors.SerializationFailure("could not serialize access")
    assert is_conflict(wrapped(serialization, psycopg.Error), "postgresql")
    assert not is_conflict(wrapped(psycopg.errors.QueryCanceled("canceling statement"),
                                   psycopg.Error), "postgresql")
    assert not is_conflict(exc.OperationalError("UPDATE", {}, Exception("database is locked")),
                           "sqlite")


def test_a_busy_sqlite_database_is_an_outage(sqlite_db: Db) -> None:
    table = seed(sqlite_db)
    locked = sa.create_engine(sqlite_db.url, connect_args={"timeout": 0.1})
    with sqlite_db.engine.connect() as holder:
        holder.exec_driver_sql(f"UPDATE {table} SET state = 1")  # holds the write lock
        error = raised(locked, lambda c: c.exec_driver_sql(f"UPDATE {table} SET state = 2"))
        holder.rollback()
    locked.dispose()
    assert "locked" in str(error.orig) and is_transient(error, "sqlite")


def wrapped(orig: Exception, base: type[Exception]) -> exc.DBAPIError:
    """`orig`, an error of the driver whose base class is `base`, as SQLAlchemy wraps it."""
    return exc.DBAPIError.instance("SELECT 1", {}, orig, base)


@pytest.mark.parametrize(("code", "what"), [
    (1226, "a user's MAX_USER_CONNECTIONS"), (1203, "max_user_connections"),
    (1040, "too many connections"), (1021, "disk full"), (1114, "table full"),
    (1053, "server shutdown in progress")])
def test_mariadb_codes_of_busy_or_full_servers_are_outages(code: int, what: str) -> None:
    # The codes a real server answers when reconnecting services crowd it or its disk fills
    # (reproduced by hand: a relay KILLed while a user's connection limit was taken): PyMySQL
    # raises them as OperationalError, like an unknown column, so only the code tells
    import pymysql

    error = pymysql.err.OperationalError(code, what)
    assert is_transient(wrapped(error, pymysql.err.Error), "mysql"), what
    assert is_transient(error, "mysql"), what
    assert not is_transient(pymysql.err.OperationalError(1054, "Unknown column"), "mysql")


@pytest.mark.parametrize(("code", "text"), [
    (3101, "Plugin instructed the server to rollback the current transaction."),
    (9001, "Max connect timeout reached while reaching hostgroup 10 after 10000ms")])
def test_codes_of_a_cluster_in_trouble_are_outages(code: int, text: str) -> None:
    # MySQL Group Replication's certification conflict and ProxySQL's lost hostgroup: not
    # servers this machine runs (a Galera node's 1047 is produced in tests/integration/
    # test_galera.py), so judged here on the errors PyMySQL raises for them
    import pymysql

    assert is_transient(wrapped(pymysql.err.OperationalError(code, text), pymysql.err.Error),
                        "mysql"), text


def test_1047_is_an_outage_only_from_a_galera_node_not_ready() -> None:
    # Galera reuses 1047 (ER_UNKNOWN_COM_ERROR) for a node out of its cluster; from any other
    # server 1047 means a command the server does not know, which waiting cannot fix
    import pymysql

    galera = pymysql.err.OperationalError(
        1047, "WSREP has not yet prepared node for application use")
    unknown = pymysql.err.OperationalError(1047, "Unknown command")
    assert is_transient(wrapped(galera, pymysql.err.Error), "mysql")
    assert not is_transient(wrapped(unknown, pymysql.err.Error), "mysql")


def test_a_driver_error_sqlalchemy_did_not_wrap_is_judged_by_its_code(server_db: Db) -> None:
    # Given a driver error raised bare (as by a caller holding a raw DB-API connection)
    table = seed(server_db)
    engine = server_db.engine
    timeout = lock_wait_timeout(server_db, table)
    unknown = raised(engine, lambda c: c.exec_driver_sql(f"UPDATE {table} SET nothing = 1"))
    # Then the driver's own errors are judged as their wrappers are
    assert is_transient(timeout.orig, engine.dialect.name)  # type: ignore[arg-type]
    assert not is_transient(unknown.orig, engine.dialect.name)  # type: ignore[arg-type]


@pytest.mark.parametrize(("error", "transient"), [
    ("DiskFull", True), ("OutOfMemory", True), ("TooManyConnections", True),
    ("IoError", True), ("ReadOnlySqlTransaction", True),
    ("ConfigurationLimitExceeded", False), ("UndefinedColumn", False)])
def test_postgresql_full_or_busy_servers_are_outages_but_a_configured_limit_is_not(
        error: str, transient: bool) -> None:
    # psycopg's classes for the SQLSTATEs a full disk (53100), memory (53200), the connection
    # limit (53300), an I/O error (58030) or a failover to a standby (25006) answer; a
    # configured limit (53400) and a schema error stay whatever we wait
    import psycopg

    orig = getattr(psycopg.errors, error)("server said so")
    assert is_transient(wrapped(orig, psycopg.Error), "postgresql") is transient, error


def test_a_full_sqlite_database_is_an_outage(sqlite_db: Db) -> None:
    # Given a SQLite database that may not grow (as a full disk would stop it)
    table = seed(sqlite_db)
    with sqlite_db.engine.begin() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    full = sa.create_engine(sqlite_db.url)
    sa.event.listen(full, "connect", lambda dbapi, _rec: dbapi.execute(
        f"PRAGMA max_page_count = {pages}"))
    # When a write needs more pages, Then the error is one to wait out
    error = raised(full, lambda c: c.exec_driver_sql(
        f"UPDATE {table} SET body = X'{'00' * 200_000}'"))
    full.dispose()
    assert "database or disk is full" in str(error.orig) and is_transient(error, "sqlite")


def test_a_login_pg8000_refuses_for_good_is_not_an_outage() -> None:
    # pg8000 raises a refused connection (no pg_hba.conf entry, SQLSTATE 28000) as an
    # InterfaceError, the class a server that is down gets too: the SQLSTATE tells them apart
    from pg8000 import exceptions as pg8000_errors

    refused = pg8000_errors.InterfaceError(
        {"S": "FATAL", "C": "28000", "M": 'no pg_hba.conf entry for host "10.0.0.9"'})
    down = pg8000_errors.InterfaceError("Can't create a connection to host 127.0.0.1 and port 1")
    assert not is_transient(wrapped(refused, pg8000_errors.Error), "postgresql")
    assert is_transient(wrapped(down, pg8000_errors.Error), "postgresql")


def test_an_error_is_described_in_one_line_by_the_drivers_class_and_text() -> None:
    import pymysql

    lost = pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    assert describe(wrapped(lost, pymysql.err.Error)) == (
        "OperationalError: (2013, 'Lost connection to MySQL server during query')")
    assert describe(ValueError("first\nsecond")) == "ValueError: first"
    assert describe(TimeoutError()) == "TimeoutError: "
