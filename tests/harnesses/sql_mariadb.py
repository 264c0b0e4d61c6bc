"""Harness: the SQL transport on the MariaDB test server, in tables of its own.

Other engineers' tests use the same database at the same time, so every harness gets a fresh
table prefix (`ckit_mq_t<random>`) and drops its tables afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumer_kit.transports.sql import SqlTransport
from tests.harnesses.sql_sqlite import FAST_OPTIONS, SqlHarness


def unique_prefix() -> str:
    """A table prefix no other test uses."""
    return f"ckit_mq_t{uuid.uuid4().hex[:10]}"


def mariadb_url() -> str:
    """The MariaDB test database URL; skips the test (fails under CI) when it does not answer."""
    from tests.services import mysql_url, ping_mysql, require

    require("MariaDB", ping_mysql)
    return mysql_url()


def drop_tables(transport: SqlTransport) -> None:
    """Drop the transport's tables (they are per-test, see `unique_prefix`)."""
    transport.tables.metadata.drop_all(transport.db.engine, checkfirst=True)


@contextmanager
def harness(tmp_path: Path) -> Iterator[SqlHarness]:
    transport = SqlTransport(mariadb_url(), table_prefix=unique_prefix(), **FAST_OPTIONS)
    try:
        yield SqlHarness(transport)
    finally:
        transport.close()
        drop_tables(transport)
        transport.db.dispose()
