"""One statement per message, compiled once and run on the driver's own cursor.

`Outbox.publish` (the outbox row) and the consumer's dedupe (the processed row) run one INSERT
in the caller's transaction for every message. Each costs what the statement costs the database
plus what Python does around it, and that Python runs right after a round trip, when little of
it is in the CPU's caches: there a call costs several times what it costs in a loop. Both
statements are compiled once per dialect (`DriverSQL`, `compile_for_driver`) and run by
`execute`, which
skips `Connection.exec_driver_sql`'s execution context and result objects when nothing could
observe the difference:

- the connection is inside a transaction SQLAlchemy began (explicit or autobegun), and
  neither a savepoint nor a transaction block of it has ended (SQLAlchemy would refuse the
  statement: so does this, through `exec_driver_sql`): the statement joins it, and the
  caller's commit or rollback ends it as before;
- no cursor event listener on the connection, its engine or the `Engine` class, and no dialect
  `do_execute` listener (tracing or logging hooks see every statement as before: with one, the
  statement goes through SQLAlchemy);
- the engine does not echo statements.

On psycopg, a statement that opens its transaction (the processed row) is sent with psycopg's
BEGIN in one round trip, as a prepared statement, when it can be (`consumer_kit.core.pg_libpq`);
one inside a begun transaction (publish's row) runs under the statement psycopg's cursor
prepared for it, once psycopg holds one (`consumer_kit.core.pg_prepared`). Otherwise on the
cursor; and through `exec_driver_sql` when the conditions above do not hold.
A connection with a
`schema_translate_map` needs the Core statement (`translates_schema`): driver SQL names its
table as compiled. Errors are the same either way: a
driver error is raised as SQLAlchemy's (`IntegrityError` for a duplicate key), and a lost
connection or an interrupt invalidates the connection, by SQLAlchemy's own handler; an error
closing the cursor after the statement ran is logged, not raised, as SQLAlchemy does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Literal, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from consumer_kit.core import pg_libpq, pg_prepared

#: What `execute` answers: the row count, the driver's last row id, or the first column of
#: the first row returned (None when no row came back).
Answer = Literal["rowcount", "lastrowid", "scalar"]


def compile_for_driver(stmt: ClauseElement, dialect: Dialect, columns: Sequence[str]
                       ) -> str | None:
    """`stmt`'s SQL for `dialect` with one named parameter per column, or None when this
    driver cannot take the values as they are (`execute` then is not for it: run the Core
    statement, which processes them).

    Only MySQL, MariaDB and PostgreSQL with named `pyformat` parameters (PyMySQL, psycopg,
    psycopg2) qualify: their drivers adapt str, int, None and datetime themselves. SQLite's
    DATETIME is text SQLAlchemy formats, so it keeps the Core statement."""
    if dialect.name not in ("mysql", "mariadb", "postgresql") \
            or dialect.paramstyle != "pyformat":
        return None
    compiled = cast(SQLCompiler, stmt.compile(dialect=dialect, column_keys=list(columns)))
    if compiled.positional or set(compiled.binds) != set(columns):
        return None
    return str(compiled)


class DriverSQL:
    """One statement's driver SQL (`compile_for_driver`), compiled once per dialect, driver
    and variant (say, with or without `RETURNING`).

    `build(dialect, variant)` gives the Core statement to compile. `sql` answers None where
    that Core statement is needed instead: a driver `compile_for_driver` refuses, or a
    connection with a `schema_translate_map` (`translates_schema`)."""

    def __init__(self, build: Callable[[Dialect, Hashable], ClauseElement]) -> None:
        self._build = build
        self._sql: dict[tuple[str, str, Hashable], str | None] = {}

    def sql(self, conn: Connection, columns: Iterable[str], variant: Hashable = None
            ) -> str | None:
        """The driver SQL for `conn` taking one named parameter per column of `columns`
        (the same columns every call for a variant: they are read only to compile), or None:
        run the Core statement."""
        if translates_schema(conn):
            return None
        dialect = conn.dialect
        key = (dialect.name, dialect.driver, variant)
        try:
            return self._sql[key]
        except KeyError:
            compiled = compile_for_driver(self._build(dialect, variant), dialect,
                                          tuple(columns))
            self._sql[key] = compiled
            return compiled


def execute(conn: Connection, sql: str, params: Mapping[str, Any],
            answer: Answer = "rowcount") -> Any:
    """Run driver SQL (`compile_for_driver`) with `params` in `conn`'s transaction; return
    `answer` of it. On the driver's cursor straight when nothing could tell (the module
    docstring), else through `exec_driver_sql`.

    Raises:
        sqlalchemy.exc.DBAPIError: the driver's error, wrapped as SQLAlchemy wraps it.
    """
    if not _direct(conn):
        return _through_sqlalchemy(conn, sql, params, answer)
    raw = conn.connection.dbapi_connection
    cursor = None
    try:
        if conn.dialect.driver == "psycopg":  # below the cursor when it can
            value = pg_libpq.run(raw, sql, params, answer)  # with its BEGIN
            if value is pg_libpq.NOT_RUN:  # inside a transaction: psycopg's prepared one
                value = pg_prepared.run(raw, sql, params, answer)
            if value is not pg_libpq.NOT_RUN:
                return value
        cursor = raw.cursor()  # type: ignore[union-attr]
        cursor.execute(sql, params)
        if answer == "scalar":
            row = cursor.fetchone()
            value = None if row is None else row[0]
        elif answer == "lastrowid":
            value = cursor.lastrowid
        else:
            value = cursor.rowcount
    except BaseException as exc:
        if isinstance(exc, Exception) and not isinstance(exc, conn.dialect.loaded_dbapi.Error):
            if cursor is not None:  # not the driver's: raised as it is, as exec_driver_sql
                conn._safe_close_cursor(cursor)  # raises it (a close error is logged)
            raise
        # wraps a driver error, closes the cursor, invalidates a lost connection (also after
        # an interrupt), then raises
        conn._handle_dbapi_exception(exc, sql, params, cursor, None)
    # as exec_driver_sql closes it: an error closing the cursor of a statement that ran is
    # logged ("Error closing cursor", the pool's logger), not raised
    conn._safe_close_cursor(cursor)
    return value


def translates_schema(conn: Connection) -> bool:
    """True when `conn` maps schemas at execution (`schema_translate_map`): driver SQL would
    name the table as compiled, so the caller runs its Core statement instead."""
    return bool(conn.get_execution_options().get("schema_translate_map"))


def _direct(conn: Connection) -> bool:
    """True when running on the cursor straight is what `exec_driver_sql` would do (the checks
    of SQLAlchemy's `Connection._execute_context` that could refuse or watch it); any
    attribute this SQLAlchemy lacks means no."""
    try:
        nested = conn._nested_transaction
        block = conn._trans_context_manager
        return (conn.in_transaction()
                and (nested is None or nested.is_active)
                and (block is None or block._transaction_is_active())
                and not conn._echo
                and not _watched(conn)
                and hasattr(conn, "_handle_dbapi_exception")
                and hasattr(conn, "_safe_close_cursor"))
    except AttributeError:
        return False


def _watched(conn: Connection) -> bool:
    """True when a listener would see the statement run through `exec_driver_sql`: a cursor
    event on the connection, its engine or the `Engine` class, or a dialect `do_execute`.
    SQLAlchemy's own flags say only that a listener was added once (they stay set after it is
    removed), so the listeners themselves are looked at when a flag is set. Driver errors go
    through SQLAlchemy's handler, so `handle_error` listeners see them either way."""
    if conn._has_events or conn.engine._has_events:
        dispatch = conn.dispatch
        if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
            return True
    return bool(conn.dialect._has_events and conn.dialect.dispatch.do_execute)


def _through_sqlalchemy(conn: Connection, sql: str, params: Mapping[str, Any],
                        answer: Answer) -> Any:
    result = conn.exec_driver_sql(sql, params)
    if answer == "scalar":
        return result.scalar()
    if answer == "lastrowid":
        return result.lastrowid
    return result.rowcount
