"""The outbox INSERT of `publish`, compiled once per dialect and run as driver SQL.

`publish` is the one cost every upstream business transaction pays, so it should cost what a
hand-written INSERT of the same row costs. Building `sa.insert(table).values(**row)` per call
and compiling it took longer than the round trip itself; here the statement is compiled once
(per dialect) and run on the driver's cursor (`consumer_kit.core.driver_sql`: straight when
no event listener or echo could tell, else by `exec_driver_sql`), the JSON column serialized
the way SQLAlchemy's `JSON` type does. Only for drivers with named `pyformat` parameters
(PyMySQL, psycopg, psycopg2) whose types need no processing; SQLite (its DATETIME is text
SQLAlchemy formats) and a connection with a `schema_translate_map` keep the Core statement.

On PostgreSQL a duplicate `(biz_type, biz_key)` is `ON CONFLICT (biz_type, biz_key) DO
NOTHING`: no row written, no error, the caller's transaction intact (a failed INSERT would
abort it, which used to cost a SAVEPOINT and its RELEASE on every publish). `RETURNING id` only
when the id is wanted (the after-commit dispatcher): reading a result row costs about a
quarter of the INSERT. MariaDB and MySQL undo just the failed statement, so a duplicate there
raises `IntegrityError` as before.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Dialect

from consumer_kit.core.driver_sql import DriverSQL, execute

#: The columns `publish` writes, in order.
COLUMNS = ("message_id", "biz_type", "biz_key", "topic", "tags", "keys", "headers", "body",
           "state", "retry_count", "max_retries", "next_retry_at", "lock_version",
           "created_by", "updated_by", "gmt_create", "gmt_modified")


#: `OutboxInsert`'s answer when the row was written but its id not asked for
NO_ID = 0


class OutboxInsert:
    """Insert one outbox row. Returns its id (`NO_ID` when written and `want_id` was false), or
    None when PostgreSQL found the business key taken (elsewhere a duplicate raises
    `IntegrityError`)."""

    def __init__(self, table: sa.Table) -> None:
        self.table = table
        self._driver = DriverSQL(self._statement)

    def __call__(self, conn: Connection, row: dict[str, Any], *, want_id: bool) -> int | None:
        pg = conn.dialect.name == "postgresql"
        returning = want_id and pg
        sql = self._driver.sql(conn, COLUMNS, returning)
        if sql is None:
            return self._core(conn, row, returning)
        params = row
        if row["headers"] is not None:  # the row keeps its dict (the dispatcher reads it)
            params = {**row, "headers": json.dumps(row["headers"])}
        if returning:
            found = execute(conn, sql, params, "scalar")
            return None if found is None else int(found)
        if pg:
            return NO_ID if execute(conn, sql, params) else None
        if want_id:
            return int(execute(conn, sql, params, "lastrowid"))
        execute(conn, sql, params)
        return NO_ID

    def _core(self, conn: Connection, row: dict[str, Any], returning: bool) -> int | None:
        if conn.dialect.name == "postgresql":  # a driver without pyformat parameters
            result = conn.execute(self._pg_statement(returning), row)
            if not returning:
                return NO_ID if result.rowcount else None
            found = result.scalar()
            return None if found is None else int(found)
        result = conn.execute(sa.insert(self.table), row)
        return int(result.inserted_primary_key[0])  # type: ignore[index]

    def _pg_statement(self, returning: bool) -> Any:
        stmt = postgresql.insert(self.table).on_conflict_do_nothing(
            index_elements=["biz_type", "biz_key"])
        # inline(): no implicit RETURNING of the primary key when the id is not wanted
        return stmt.returning(self.table.c.id) if returning else stmt.inline()

    def _statement(self, dialect: Dialect, returning: Hashable) -> Any:
        """The Core statement `DriverSQL` compiles for `dialect`."""
        if dialect.name == "postgresql":
            return self._pg_statement(bool(returning))
        return sa.insert(self.table).inline()
