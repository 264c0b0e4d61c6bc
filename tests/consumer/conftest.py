"""Consumer fixtures: (SQLite + fakeredis) for unit speed, (MariaDB or PostgreSQL + real Redis)
for truth."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import sqlalchemy as sa

from consumer_kit import ConsumerApp
from consumer_kit.transports import Delivery
from consumer_kit.transports.memory import MemoryTransport
from tests import services
from tests.conftest import Db, _make_db

_seq = itertools.count(1)


@dataclass
class Env:
    """A consumer environment: database with tables, a Redis, and a business table `stock`
    where every applied effect is one row (so a double effect is visible as a count of 2)."""

    db: Db
    redis: redis.Redis
    stock: sa.Table
    kind: str

    def app(self, *, group: str = "inventory", use_redis: bool = True, **kwargs: Any
            ) -> ConsumerApp:
        kwargs.setdefault("receipts", None)
        kwargs.setdefault("transport", MemoryTransport())
        return ConsumerApp(group=self.group(group), db=self.db.engine,
                           redis=self.redis if use_redis else None,
                           processed_table=self.db.names.processed, **kwargs)

    def group(self, name: str) -> str:
        """A group name unique to this test (real Redis keeps keys between tests)."""
        return f"{name}-{self.db.names.outbox[:9]}"

    def effects(self) -> dict[str, int]:
        with self.db.engine.connect() as conn:
            return {sku: n for sku, n in conn.execute(
                sa.select(self.stock.c.sku, sa.func.count()).group_by(self.stock.c.sku))}

    def processed(self) -> list[tuple[str, str, str | None]]:
        with self.db.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(  # type: ignore[misc]
                f"SELECT message_id, status, error FROM {self.db.names.processed} "
                "ORDER BY message_id"))]


def add_reservation(env: Env, session: Any, sku: str) -> None:
    """The business write of the test handlers: one INSERT per reservation."""
    session.execute(sa.insert(env.stock).values(sku=sku, reserved=1))


def delivery(ckit_id: str | None = "M1", body: bytes = b'{"sku": "A"}', *,
             keys: str = "", broker_id: str | None = None, topic: str = "ORDER_CREATED",
             tags: str = "created", src: str | None = "orders", reconsume: int = 0) -> Delivery:
    props = {}
    if ckit_id is not None:
        props["ckit_id"] = ckit_id
    if src:
        props["ckit_src"] = src
    return Delivery(topic=topic, body=body, broker_message_id=broker_id or f"B{next(_seq)}",
                    tags=tags, keys=keys, properties=props, reconsume_times=reconsume)


def _env(kind: str, tmp_path: Path) -> Iterator[Env]:
    if kind == "sqlite":
        client: redis.Redis = fakeredis.FakeRedis()
    else:
        services.require("redis", services.ping_redis)
        client = redis.Redis.from_url(services.redis_url())
    for db in _make_db(kind, tmp_path, prefix="c"):
        stock = sa.Table(f"stock_{uuid.uuid4().hex[:8]}", sa.MetaData(),
                         sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                         sa.Column("sku", sa.String(32), nullable=False),
                         sa.Column("reserved", sa.Integer, nullable=False))
        stock.create(db.engine)
        try:
            yield Env(db, client, stock, kind)
        finally:
            stock.drop(db.engine)
            client.close()


REAL_KINDS = [
    pytest.param("mariadb", marks=[pytest.mark.mariadb, pytest.mark.redis]),
    pytest.param("postgresql", marks=[pytest.mark.postgresql, pytest.mark.redis]),
]


@pytest.fixture(params=["sqlite", *REAL_KINDS])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """SQLite + fakeredis, and real MariaDB or real PostgreSQL + real Redis."""
    yield from _env(request.param, tmp_path)


@pytest.fixture(params=REAL_KINDS)
def real_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """Real MariaDB or real PostgreSQL + real Redis only."""
    yield from _env(request.param, tmp_path)
