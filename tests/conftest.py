"""Shared fixtures: a database parametrized over SQLite, real MariaDB and real PostgreSQL.

Each test gets its own table names, so tests on the shared servers never see each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from tests import services


@dataclass
class Db:
    """A database with every consumer-kit table created under unique names."""

    engine: Engine
    names: TableNames
    kind: str
    url: str

    def count(self, table: str, where: str = "1=1") -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE {where}")).scalar()
                       or 0)


def unique_names(prefix: str = "t") -> TableNames:
    tag = uuid.uuid4().hex[:8]
    return TableNames(outbox=f"{prefix}{tag}_outbox", receipts=f"{prefix}{tag}_ack",
                      processed=f"{prefix}{tag}_processed", mq_prefix=f"{prefix}{tag}_mq")


def database_url(kind: str, tmp_path: Path, second: bool = False) -> str:
    """The URL of a `sqlite` file in `tmp_path` or of the real `mariadb` / `postgresql` test
    database (`second`: the other database of that server), after `services.require` for it.
    `pg8000` is the PostgreSQL database through the pg8000 driver."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / ('ckit2.db' if second else 'ckit.db')}"
    if kind == "mariadb":
        url = services.mysql_url2() if second else services.mysql_url()
        services.require("mariadb", lambda: services.ping_mysql(url))
        return url
    if kind in ("postgresql", "pg8000"):
        url = services.pg_url2() if second else services.pg_url()
        services.require("postgresql", lambda: services.ping_postgres(url))
        if kind == "pg8000":  # the pure-Python driver, on the same server
            return sa.make_url(url).set(drivername="postgresql+pg8000").render_as_string(
                hide_password=False)
        return url
    raise ValueError(f"unknown database kind {kind!r}")


#: The kinds every database-parametrized fixture runs on, each real server with its marker.
DB_KINDS = [
    "sqlite",
    pytest.param("mariadb", marks=pytest.mark.mariadb),
    pytest.param("postgresql", marks=pytest.mark.postgresql),
]


def _make_db(kind: str, tmp_path: Path, prefix: str = "t") -> Iterator[Db]:
    url = database_url(kind, tmp_path)
    engine = make_engine(url)
    names = unique_names(prefix)
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(engine)
    try:
        yield Db(engine, names, kind, url)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture(params=DB_KINDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """The producer/consumer tables on SQLite, real MariaDB and real PostgreSQL."""
    yield from _make_db(request.param, tmp_path)


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Db]:
    """The tables on SQLite only (fast unit tests)."""
    yield from _make_db("sqlite", tmp_path)


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[Db]:
    """The tables on real MariaDB only."""
    yield from _make_db("mariadb", tmp_path)


@pytest.fixture(params=[pytest.param("mariadb", marks=pytest.mark.mariadb),
                        pytest.param("postgresql", marks=pytest.mark.postgresql)])
def server_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """The tables on each real database server (MariaDB, PostgreSQL): concurrency and isolation
    tests that SQLite's single writer cannot show."""
    yield from _make_db(request.param, tmp_path)
