"""consumer-kit's side of the peer bench: publish (Connection; Session + after-commit Dispatcher),
relay drain, and (in `ckit_dedupe`) the decorated consumer. Runs in the project's environment."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from bench.peers import harness
from bench.peers.runners.ckit_dedupe import dedupe
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.base import Transport
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Dispatcher, Outbox, Relay
from outbox_producer.ids import new_message_id

#: the columns `Outbox.publish` writes, in the order the floor's hand-written INSERT lists them
FLOOR_COLUMNS = ("message_id", "biz_type", "biz_key", "topic", "tags", "keys", "headers", "body",
                 "state", "retry_count", "max_retries", "next_retry_at", "lock_version",
                 "created_by", "updated_by", "gmt_create", "gmt_modified")


def orders_table(metadata: sa.MetaData, prefix: str) -> sa.Table:
    """The business table every peer's transaction writes one row into."""
    return sa.Table(f"{prefix}_orders", metadata,
                    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
                    sa.Column("sku", sa.String(64), nullable=False),
                    sa.Column("qty", sa.Integer, nullable=False))


def floor_sql(engine: sa.engine.Engine, table: str) -> str:
    """A hand-written INSERT of the outbox row (identifiers quoted: `keys` is reserved in
    MariaDB), in the driver's own parameter style."""
    quote = engine.dialect.identifier_preparer.quote
    marks = ", ".join(f"%({c})s" for c in FLOOR_COLUMNS)
    return (f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in FLOOR_COLUMNS)}) "
            f"VALUES ({marks})")


def floor_row(key: str) -> dict[str, Any]:
    """The same row `publish` writes for `payload(key)`, built by hand."""
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    return {"message_id": uuid.uuid4().hex[:26], "biz_type": "order", "biz_key": key,
            "topic": "ORDER_CREATED", "tags": None, "keys": None, "headers": None,
            "body": json.dumps(payload(key), separators=(",", ":")).encode(),
            "state": 0, "retry_count": 0, "max_retries": 10, "next_retry_at": now,
            "lock_version": 0, "created_by": "bench", "updated_by": "bench",
            "gmt_create": now, "gmt_modified": now}


def payload(key: str) -> dict[str, Any]:
    """The message every peer publishes."""
    return {"order_id": key, "sku": "SKU-1", "qty": 1}


def publish(job: dict[str, Any]) -> dict[str, Any]:
    """bare / floor / core / publish with a Connection, or the same with a Session and the
    after-commit Dispatcher (`job["api"] == "session"`)."""
    engine = make_engine(job["url"])
    prefix = job["prefix"]
    metadata = sa.MetaData()
    orders = orders_table(metadata, prefix)
    outbox_t = outbox_table(metadata, f"{prefix}_outbox")
    metadata.create_all(engine)
    sql = floor_sql(engine, outbox_t.name)
    dispatcher = None
    try:
        if job["api"] == "session":
            dispatcher = Dispatcher(engine, MemoryTransport(), table=outbox_t.name).start()
        outbox = Outbox(engine, producer="bench", table=outbox_t.name, dispatcher=dispatcher)
        if job["api"] == "session":
            variants = session_variants(engine, orders, outbox, sql)
        else:
            variants = connection_variants(engine, orders, outbox, outbox_t, sql)
        runs = harness.publish_runs(variants, int(job["n"]), int(job["runs"]))
        if dispatcher is not None:
            dispatcher.flush(60)
        with engine.connect() as conn:  # with the dispatcher: every published row was sent
            unsent = conn.execute(sa.select(sa.func.count()).select_from(outbox_t).where(
                outbox_t.c.biz_key.like("p%"),
                outbox_t.c.state == int(OutboxState.PENDING))).scalar()
        return {"runs": runs, "published_unsent": unsent}
    finally:
        if dispatcher is not None:
            dispatcher.close(10)
        metadata.drop_all(engine)
        engine.dispose()


def connection_variants(engine: sa.engine.Engine, orders: sa.Table, outbox: Outbox,
                        outbox_t: sa.Table, sql: str) -> list[tuple[str, harness.Variant]]:
    insert_order = orders.insert()
    insert_outbox = outbox_t.insert()

    def bare(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})

    def floor(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            conn.exec_driver_sql(sql, floor_row("f" + key))

    def core(key: str) -> None:
        # the same row through a prebuilt SQLAlchemy Core insert: what SQLAlchemy adds to the floor
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            conn.execute(insert_outbox, floor_row("c" + key))

    def with_publish(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            outbox.publish(conn, "ORDER_CREATED", payload(key), biz_type="order",
                           biz_key="p" + key)

    return [("bare", bare), ("floor", floor), ("core", core), ("publish", with_publish)]


def session_variants(engine: sa.engine.Engine, orders: sa.Table, outbox: Outbox,
                     sql: str) -> list[tuple[str, harness.Variant]]:
    insert_order = orders.insert()

    def bare(key: str) -> None:
        with Session(engine) as session, session.begin():
            session.execute(insert_order, {"sku": key, "qty": 1})

    def floor(key: str) -> None:
        with Session(engine) as session, session.begin():
            session.execute(insert_order, {"sku": key, "qty": 1})
            session.connection().exec_driver_sql(sql, floor_row("f" + key))

    def with_publish(key: str) -> None:
        # the caller's commit latency: the dispatcher sends on its own thread after commit
        with Session(engine) as session, session.begin():
            session.execute(insert_order, {"sku": key, "qty": 1})
            outbox.publish(session, "ORDER_CREATED", payload(key), biz_type="order",
                           biz_key="p" + key)

    return [("bare", bare), ("floor", floor), ("publish", with_publish)]


def drain(job: dict[str, Any]) -> dict[str, Any]:
    """`Relay.run_once()` to a no-op transport (the peers drain to no-op publishers too), batch,
    workers and claim mode (`lease`, `lock`) swept."""
    engine = make_engine(job["url"])
    metadata = sa.MetaData()
    table = outbox_table(metadata, f"{job['prefix']}_outbox")
    metadata.create_all(engine)

    def fill(n: int) -> None:
        with engine.begin() as conn:
            conn.execute(table.delete())
        now = utcnow()
        rows = [{"message_id": new_message_id(), "biz_type": "order", "biz_key": str(i),
                 "topic": "ORDER_CREATED", "body": json.dumps(payload(str(i))).encode(),
                 "state": 0, "retry_count": 0, "max_retries": 10, "next_retry_at": now,
                 "lock_version": 0, "created_by": "bench", "gmt_create": now,
                 "gmt_modified": now} for i in range(n)]
        for start in range(0, n, 5000):
            with engine.begin() as conn:
                conn.execute(table.insert(), rows[start:start + 5000])
        analyze(engine, table.name)

    def run(setting: dict[str, Any], n: int) -> tuple[float, int]:
        transport = NullTransport()
        relay = Relay(engine, transport, table=table.name, batch=int(setting["batch"]),
                      workers=int(setting["workers"]), claim=str(setting.get("claim", "lease")))
        t0 = time.perf_counter()
        result = relay.run_once()
        seconds = time.perf_counter() - t0
        with engine.connect() as conn:
            sent = conn.execute(sa.select(sa.func.count()).select_from(table).where(
                table.c.state == int(OutboxState.SENT))).scalar()
        if sent != result.stats.sent:
            raise SystemExit(f"relay said {result.stats.sent} sent, table has {sent} SENT")
        return seconds, int(sent or 0)

    try:
        return harness.drain_runs(job, fill, run)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


class NullTransport(Transport):
    """A transport that accepts every message and delivers none: the drain's no-op publisher."""

    scheme = "null"

    def __init__(self) -> None:
        self.count = itertools.count(1)

    def send(self, message: OutgoingMessage) -> SendResult:
        return SendResult(str(next(self.count)))

    def consumer(self, group: str, subscriptions: Any, callback: Any, *,
                 threads: int = 1) -> Any:
        raise NotImplementedError("the drain only sends")

    def dead_letters(self, group: str) -> list[Any]:
        return []


def analyze(engine: sa.engine.Engine, table: str) -> None:
    """Fresh planner statistics after a bulk fill (every runner does the same)."""
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as conn:
        stmt = "ANALYZE TABLE " if engine.dialect.name in ("mysql", "mariadb") else "ANALYZE "
        result = conn.exec_driver_sql(stmt + quote(table))
        if result.returns_rows:
            result.fetchall()


def main() -> None:
    job = harness.read_job()
    measure = job["measure"]
    if measure == "publish":
        result = publish(job)
    elif measure == "drain":
        result = drain(job)
    else:
        result = dedupe(job)
    result["versions"] = harness.versions("consumer-kit", "SQLAlchemy", "PyMySQL", "psycopg",
                                          "redis")
    harness.emit(result)


if __name__ == "__main__":
    main()
