"""`LOCK TABLES <table> WRITE` on MySQL/MariaDB, waited for a bounded time: while it is held no
other session reads or writes the table, and it is granted only once every transaction that
touched the table has ended (what `ckit outbox partitions rotate` needs around its last check
and DROP PARTITION)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

#: MySQL/MariaDB: "Lock wait timeout exceeded"
ER_LOCK_WAIT_TIMEOUT = 1205


class LockBusy(Exception):
    """`LOCK TABLES` waited `wait` seconds in vain."""


@contextlib.contextmanager
def write_locked(engine: Engine, table: str, *, wait: int) -> Iterator[Connection]:
    """A connection holding `LOCK TABLES table WRITE` (the tables of its trigger with it),
    waited for at most `wait` seconds (publishes queue behind a pending lock: a long
    transaction on the outbox must not hold them all for MariaDB's default of a year).

    Raises:
        LockBusy: the lock was not granted in time.
    """
    with engine.connect() as conn:
        try:
            conn.exec_driver_sql(f"SET SESSION lock_wait_timeout = {int(wait)}")
            conn.exec_driver_sql(f"LOCK TABLES {table} WRITE")
        except sa.exc.OperationalError as exc:
            conn.invalidate()  # its session variable goes with it
            if getattr(exc.orig, "args", [None])[0] == ER_LOCK_WAIT_TIMEOUT:
                raise LockBusy(str(exc.orig)) from None
            raise
        try:
            yield conn
        finally:
            with contextlib.suppress(sa.exc.DBAPIError):
                conn.exec_driver_sql("UNLOCK TABLES")
            conn.invalidate()  # its session's lock_wait_timeout goes with it
