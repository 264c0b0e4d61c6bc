"""Harness: the SQL transport on the PostgreSQL test server, in tables of its own (a fresh table
prefix per harness, dropped afterwards: other tests share the database)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumer_kit.transports.sql import SqlTransport
from tests.harnesses.sql_mariadb import drop_tables, unique_prefix
from tests.harnesses.sql_sqlite import FAST_OPTIONS, SqlHarness


def postgresql_url() -> str:
    """The PostgreSQL test database URL; skips the test (fails under CI) when it does not answer."""
    from tests.services import pg_url, ping_postgres, require

    require("PostgreSQL", ping_postgres)
    return pg_url()


@contextmanager
def harness(tmp_path: Path) -> Iterator[SqlHarness]:
    transport = SqlTransport(postgresql_url(), table_prefix=unique_prefix(), **FAST_OPTIONS)
    try:
        yield SqlHarness(transport)
    finally:
        transport.close()
        drop_tables(transport)
        transport.db.dispose()
