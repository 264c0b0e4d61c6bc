"""What a group's or producer's URL says beyond host, port and database (a PostgreSQL
`search_path` in `?options=`, a socket, TLS) must reach the Spark engine's JDBC reads as it
reaches the SQL engine's and the checks' SQLAlchemy connections, or be refused: silently
dropped, the JDBC reads go to another schema's table of the same name (or another server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import processed_table
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile import GroupSource, run_reconcile
from spark.jdbc import to_jdbc
from tests.reconcile.conftest import World, make_world


def test_a_postgresql_search_path_in_the_url_reaches_the_jdbc_reads() -> None:
    src = to_jdbc("postgresql+psycopg://app:pw@db/orders?options=-csearch_path%3Dbilling")
    assert src.properties["options"] == "-csearch_path=billing"
    assert "options" not in src.url and "pw" not in src.display


def test_url_options_that_change_no_read_are_accepted_by_the_spark_engine() -> None:
    src = to_jdbc("mysql+pymysql://app:pw@db/orders?charset=utf8mb4&read_timeout=30"
                  "&connect_timeout=5")
    assert src.url == "jdbc:mysql://db:3306/orders?permitMysqlScheme"


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://app:pw@/orders?host=/var/run/postgresql",
    "postgresql+psycopg://app:pw@db/orders?service=orders",
    "mysql+pymysql://app:pw@/orders?unix_socket=/run/mysqld/mysqld.sock",
    "mysql+pymysql://app:pw@db/orders?ssl_ca=/etc/ca.pem",
])
def test_the_spark_engine_refuses_url_options_jdbc_would_silently_drop(url: str) -> None:
    with pytest.raises(ConfigError, match="--engine sql") as info:
        to_jdbc(url)
    assert "pw@" not in str(info.value)


@pytest.fixture
def pg_world(tmp_path: Path) -> Iterator[World]:
    yield from make_world("postgresql", tmp_path)


@pytest.mark.postgresql
@pytest.mark.parametrize("engine_name", ["sql", pytest.param("spark", marks=pytest.mark.spark)])
def test_a_group_whose_processed_table_is_in_another_schema_is_read_there(
        pg_world: World, engine_name: str, request: pytest.FixtureRequest) -> None:
    if engine_name == "spark":
        request.getfixturevalue("spark")
    world = pg_world
    # Given the group's processed rows in schema s<tag> (the URL's search_path), while public
    # holds an empty table of the same name
    schema = f"s{uuid.uuid4().hex[:8]}"
    engine = world.group_engines["inventory"]
    table = world.processed["inventory"].name
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    meta = sa.MetaData(schema=schema)
    own = processed_table(meta, table)
    meta.create_all(engine)
    try:
        mid = world.add_outbox(OutboxState.SENT)
        with engine.begin() as conn:
            conn.execute(own.insert().values(
                consumer_group="inventory", message_id=mid, topic="ORDER", src="orders",
                status="SUCCEEDED", attempts=1, first_seen_at=world.now, processed_at=world.now))
        url = world.group_urls["inventory"] + f"?options=-csearch_path%3D{schema}"
        config: Any = world.config(engine_name, orphan_window=__import__("datetime").timedelta(0))
        config = type(config)(**{**config.__dict__, "groups": (
            GroupSource("inventory", url, table=table),)})
        # When it is reconciled
        summary = run_reconcile(config)
        # Then the processed row was found: the row is CONSUMED, not re-sent
        assert world.row(mid).state == OutboxState.CONSUMED, summary
    finally:
        meta.drop_all(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
