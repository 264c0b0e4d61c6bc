"""One fixture parametrized over every transport backend (dramatiq's pattern).

Each backend has a module `tests/harnesses/<name>.py` with a `harness(tmp_path)` context manager.
Backends whose service is not up skip locally and fail under CI (see tests/services.py).
The SQL transport's own tests get a database (`db`) on a SQLite file and on MariaDB.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_kit.testing.harness import Harness
from consumer_kit.transports.sql import SqlTransport
from tests.harnesses.sql_mariadb import drop_tables, mariadb_url, unique_prefix
from tests.harnesses.sql_postgresql import postgresql_url
from tests.harnesses.sql_sqlite import FAST_OPTIONS, sqlite_url

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sql_sqlite", id="sql-sqlite"),
    pytest.param("sql_mariadb", id="sql-mariadb", marks=pytest.mark.mariadb),
    pytest.param("sql_postgresql", id="sql-postgresql", marks=pytest.mark.postgresql),
    pytest.param("rocketmq", id="rocketmq", marks=pytest.mark.rocketmq),
    pytest.param("rocketmq_v5broker", id="rocketmq-v5broker", marks=pytest.mark.rocketmq5),
    pytest.param("rocketmq5", id="rocketmq5", marks=pytest.mark.rocketmq5),
]


#: Known failures of a backend, by test id: strict, so a fix shows up as an unexpected pass.
KNOWN_FAILURES: dict[str, str] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = KNOWN_FAILURES.get(item.name)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    module = importlib.import_module(f"tests.harnesses.{request.param}")
    with module.harness(tmp_path) as h:
        yield h


@pytest.fixture
def h(harness: Harness) -> Harness:
    """Short alias used by the conformance tests."""
    return harness


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb),
                        pytest.param("postgresql", marks=pytest.mark.postgresql)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(database URL, a table prefix of this test's own) for the SQL transport; on MariaDB and
    PostgreSQL, which other tests share, the prefix's tables are dropped afterwards."""
    if request.param == "sqlite":
        url, prefix = sqlite_url(tmp_path), "ckit_mq"
    elif request.param == "mariadb":
        url, prefix = mariadb_url(), unique_prefix()
    else:
        url, prefix = postgresql_url(), unique_prefix()
    yield url, prefix
    if request.param != "sqlite":
        cleanup = SqlTransport(url, table_prefix=prefix)
        drop_tables(cleanup)
        cleanup.close()


@pytest.fixture
def transport(db: tuple[str, str]) -> Iterator[SqlTransport]:
    """A transport with fast test settings on the `db` fixture's database (tests/transports)."""
    url, prefix = db
    t = SqlTransport(url, table_prefix=prefix, **FAST_OPTIONS)
    yield t
    t.close()
