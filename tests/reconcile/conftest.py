"""Fixtures for the reconciler: a session-scoped local Spark, and a `World` of one producer
database plus consumer-group databases (SQLite files, real MariaDB or real PostgreSQL), filled
row by row."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import outbox_table, processed_table, receipt_table
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile import GroupSource, ReconcileConfig
from tests import services
from tests.conftest import DB_KINDS, database_url

STUCK_AFTER = dt.timedelta(minutes=10)
OLD = dt.timedelta(hours=1)  # older than the cutoff
RECENT = dt.timedelta(minutes=1)  # younger than the cutoff


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for the whole run: 2 cores, 2 shuffle partitions, no UI, JDBC jars."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    from consumer_kit.core.errors import ConfigError
    from spark.jdbc import find_jars
    from spark.session import LOOPBACK_DRIVER_CONF

    try:
        jars = find_jars({"sqlite", "mysql", "postgresql"})
    except ConfigError as exc:
        missing = exc

        def ping() -> None:
            raise missing

        services.require("JDBC driver jars", ping)
    builder = pyspark_sql.SparkSession.builder
    for key, value in LOOPBACK_DRIVER_CONF.items():  # as the job does in local mode
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]").appName("ckit-reconcile-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.jars", ",".join(jars))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclasses.dataclass
class World:
    """A producer database (outbox + acks) and one processed table per consumer group."""

    kind: str
    producer_url: str
    producer: sa.Engine
    outbox: sa.Table
    receipts: sa.Table
    group_urls: dict[str, str]
    group_engines: dict[str, sa.Engine]
    processed: dict[str, sa.Table]
    now: dt.datetime
    topics: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def add_outbox(self, state: OutboxState, *, age: dt.timedelta = OLD,
                   lease_age: dt.timedelta | None = None, retry_count: int = 0,
                   max_retries: int = 3, topic: str = "ORDER", lock_version: int = 2,
                   message_id: str | None = None) -> str:
        """Insert an outbox row; `age` sets sent_at (SENT and later), `lease_age` lease_until."""
        message_id = message_id or f"m-{uuid.uuid4().hex}"
        ts = self.now - age
        with self.producer.begin() as conn:
            conn.execute(self.outbox.insert().values(
                message_id=message_id, biz_type="ORDER_CREATED", biz_key=message_id,
                topic=topic, body=b"{}", state=int(state), retry_count=retry_count,
                max_retries=max_retries, next_retry_at=ts - dt.timedelta(seconds=5),
                sent_at=ts if state >= OutboxState.SENT else None,
                lease_owner="relay-1" if state == OutboxState.SENDING else None,
                lease_until=(self.now - lease_age) if lease_age is not None else None,
                lock_version=lock_version, created_by="orders", updated_by="relay",
                gmt_create=ts - dt.timedelta(seconds=5), gmt_modified=ts))
        return message_id

    def add_processed(self, group: str, message_id: str, status: str = "SUCCEEDED", *,
                      error: str | None = None, age: dt.timedelta = OLD,
                      topic: str = "ORDER", src: str = "orders") -> None:
        """Insert a processed row for `group`; `src` is the producer it came from."""
        ts = self.now - age
        with self.group_engines[group].begin() as conn:
            conn.execute(self.processed[group].insert().values(
                consumer_group=group, message_id=message_id, topic=topic, src=src,
                status=status, attempts=1, error=error, first_seen_at=ts, processed_at=ts))

    def add_ack(self, message_id: str, group: str, outcome: str = "consumed", *,
                age: dt.timedelta = OLD) -> None:
        """Insert an ack row in the producer database, received `age` ago."""
        with self.producer.begin() as conn:
            conn.execute(self.receipts.insert().values(message_id=message_id, consumer_group=group,
                                                  outcome=outcome, received_at=self.now - age))

    def row(self, message_id: str) -> Any:
        """The outbox row of `message_id`."""
        with self.producer.connect() as conn:
            return conn.execute(sa.select(self.outbox).where(
                self.outbox.c.message_id == message_id)).one()

    def receipts_of(self, message_id: str) -> dict[str, str]:
        """`{group: outcome}` of the ack rows of `message_id`."""
        with self.producer.connect() as conn:
            r = self.receipts.c
            rows = conn.execute(sa.select(r.consumer_group, r.outcome).where(
                r.message_id == message_id)).all()
        return {r.consumer_group: r.outcome for r in rows}

    def snapshot(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every outbox and ack row, to prove a run wrote nothing."""
        with self.producer.connect() as conn:
            outbox = [tuple(r) for r in conn.execute(
                sa.select(self.outbox).order_by(self.outbox.c.id))]
            acks = [tuple(r) for r in conn.execute(
                sa.select(self.receipts).order_by(self.receipts.c.message_id,
                                                  self.receipts.c.consumer_group))]
        return outbox, acks

    def config(self, engine: str, **kwargs: Any) -> ReconcileConfig:
        """A config over this world's databases with `now` fixed."""
        groups = tuple(GroupSource(name=g, url=u, table=self.processed[g].name,
                                   topics=self.topics.get(g, ()))
                       for g, u in self.group_urls.items())
        kwargs.setdefault("output_dir", None)
        return ReconcileConfig(producer_url=self.producer_url, groups=groups,
                               outbox_table=self.outbox.name, receipt_table=self.receipts.name,
                               stuck_after=STUCK_AFTER, engine=engine, now=self.now,
                               master="local[2]", **kwargs)


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'producer.db'}", f"sqlite:///{tmp_path / 'consumer.db'}"
    return database_url(kind, tmp_path), database_url(kind, tmp_path, second=True)


def make_world(kind: str, tmp_path: Path,
               groups: tuple[str, ...] = ("inventory",)) -> Iterator[World]:
    """Create the tables under unique names (groups alternate between two databases)."""
    producer_url, other_url = _urls(kind, tmp_path)
    tag = uuid.uuid4().hex[:8]
    producer = make_engine(producer_url)
    meta = sa.MetaData()
    outbox = outbox_table(meta, f"rc{tag}_outbox")
    receipts = receipt_table(meta, f"rc{tag}_rcpt")
    meta.create_all(producer)
    group_urls: dict[str, str] = {}
    engines: dict[str, sa.Engine] = {}
    processed: dict[str, sa.Table] = {}
    metas: list[tuple[sa.MetaData, sa.Engine]] = [(meta, producer)]
    by_url: dict[str, sa.Engine] = {producer_url: producer}
    for i, group in enumerate(groups):
        # The first group lives in a second database, the next beside the producer, and so on.
        url = other_url if i % 2 == 0 else producer_url
        engine = by_url.setdefault(url, by_url.get(url) or make_engine(url))
        gmeta = sa.MetaData()
        processed[group] = processed_table(gmeta, f"rc{tag}_p{i}")
        gmeta.create_all(engine)
        metas.append((gmeta, engine))
        group_urls[group] = url
        engines[group] = engine
    try:
        yield World(kind=kind, producer_url=producer_url, producer=producer, outbox=outbox,
                    receipts=receipts, group_urls=group_urls, group_engines=engines,
                    processed=processed, now=utcnow())
    finally:
        for m, e in metas:
            m.drop_all(e)
        for e in by_url.values():
            e.dispose()


KINDS = DB_KINDS
ENGINES = ["sql", pytest.param("spark", marks=pytest.mark.spark)]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """The database kind: SQLite files, real MariaDB or real PostgreSQL."""
    return str(request.param)


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    """The reconcile engine under test."""
    if request.param == "spark":
        request.getfixturevalue("spark")
    return str(request.param)


@pytest.fixture
def world(kind: str, tmp_path: Path) -> Iterator[World]:
    """One producer and one consumer group (`inventory`)."""
    yield from make_world(kind, tmp_path)


@pytest.fixture
def world2(kind: str, tmp_path: Path) -> Iterator[World]:
    """One producer and two consumer groups (`inventory`, `billing`) in two databases."""
    yield from make_world(kind, tmp_path, ("inventory", "billing"))
