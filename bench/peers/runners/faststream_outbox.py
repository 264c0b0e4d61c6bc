"""faststream-outbox on PostgreSQL (SQLAlchemy asyncio over asyncpg): `broker.publish(...,
session=...)` in the caller's transaction, and its subscriber draining the table to a no-op
handler. Runs in faststream-outbox's own environment."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import sqlalchemy as sa
from faststream_outbox import OutboxBroker, make_outbox_table
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from bench.peers import harness

QUEUE = "orders"
#: drain completion is polled this often once the handler has seen every row
POLL_S = 0.005


def payload(key: str) -> dict[str, Any]:
    return {"order_id": key, "sku": "SKU-1", "qty": 1}


def async_url(url: str) -> str:
    return "postgresql+asyncpg://" + url.split("://", 1)[1]


async def setup(job: dict[str, Any], pool_size: int = 5) -> tuple[AsyncEngine, sa.Table,
                                                                    sa.Table]:
    engine = create_async_engine(async_url(job["url"]), pool_size=pool_size, max_overflow=10)
    metadata = sa.MetaData()
    table = make_outbox_table(metadata, table_name=f"{job['prefix']}_outbox")
    orders = sa.Table(f"{job['prefix']}_orders", metadata,
                      sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
                      sa.Column("sku", sa.String(64), nullable=False),
                      sa.Column("qty", sa.Integer, nullable=False))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    return engine, table, orders


async def teardown(engine: AsyncEngine, *tables: sa.Table) -> None:
    async with engine.begin() as conn:
        for table in tables:
            await conn.run_sync(table.drop, checkfirst=True)
    await engine.dispose()


async def publish(job: dict[str, Any]) -> dict[str, Any]:
    engine, table, orders = await setup(job)
    broker = OutboxBroker(engine, outbox_table=table, logger=None)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    insert_order = orders.insert()
    floor_sql = sa.text(f"INSERT INTO {table.name} (queue, payload, headers) "
                        "VALUES (:queue, :payload, CAST(:headers AS JSONB))")

    async def bare(key: str) -> None:
        async with sessions() as session, session.begin():
            await session.execute(insert_order, {"sku": key, "qty": 1})

    async def floor(key: str) -> None:
        async with sessions() as session, session.begin():
            await session.execute(insert_order, {"sku": key, "qty": 1})
            await session.execute(floor_sql, {"queue": QUEUE,
                                              "payload": json.dumps(payload(key)).encode(),
                                              "headers": "{}"})

    async def with_publish(key: str) -> None:
        async with sessions() as session, session.begin():
            await session.execute(insert_order, {"sku": key, "qty": 1})
            await broker.publish(payload(key), queue=QUEUE, session=session)

    try:
        runs = await harness.publish_runs_async(
            [("bare", bare), ("floor", floor), ("publish", with_publish)],
            int(job["n"]), int(job["runs"]))
        return {"runs": runs}
    finally:
        await teardown(engine, table, orders)


async def drain(job: dict[str, Any]) -> dict[str, Any]:
    max_workers = max(int(s["workers"]) for s in job["settings"])
    engine, table, orders = await setup(job, pool_size=max_workers + 4)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    loop = asyncio.get_running_loop()

    async def fill(n: int) -> None:
        async with engine.begin() as conn:
            await conn.execute(sa.text(f"TRUNCATE {table.name}"))
        # through the broker's own batch publish, so headers and encoding are its own
        broker = OutboxBroker(engine, outbox_table=table, logger=None)
        for start in range(0, n, 5000):
            bodies = [payload(str(i)) for i in range(start, min(n, start + 5000))]
            async with sessions() as session, session.begin():
                await broker.publish_batch(*bodies, queue=QUEUE, session=session)
        async with engine.begin() as conn:
            await conn.execute(sa.text(f"ANALYZE {table.name}"))

    async def run(setting: dict[str, Any], n: int) -> tuple[float, int]:
        broker = OutboxBroker(engine, outbox_table=table, logger=None)
        seen = 0
        all_seen = asyncio.Event()

        @broker.subscriber(QUEUE, max_workers=int(setting["workers"]),
                           fetch_batch_size=int(setting["batch"]),
                           terminal_flush_batch_size=int(setting["flush"]),
                           min_fetch_interval=0.01, max_fetch_interval=0.1)
        async def handle(body: dict[str, Any]) -> None:
            nonlocal seen
            seen += 1
            if seen == n:
                all_seen.set()

        t0 = time.perf_counter()
        await broker.start()
        try:
            await asyncio.wait_for(all_seen.wait(), timeout=600)
            while True:  # the last deletes land after the handler returned
                async with engine.connect() as conn:
                    left = (await conn.execute(
                        sa.select(sa.func.count()).select_from(table))).scalar()
                if not left:
                    break
                await asyncio.sleep(POLL_S)
            seconds = time.perf_counter() - t0
        finally:
            await broker.stop()
        return seconds, seen

    try:
        return await loop.run_in_executor(None, lambda: harness.drain_runs(
            job,
            lambda n: asyncio.run_coroutine_threadsafe(fill(n), loop).result(),
            lambda s, n: asyncio.run_coroutine_threadsafe(run(s, n), loop).result()))
    finally:
        await teardown(engine, table, orders)


def main() -> None:
    job = harness.read_job()
    result = harness.run_async(publish(job) if job["measure"] == "publish" else drain(job))
    result["versions"] = harness.versions("faststream-outbox", "faststream", "SQLAlchemy",
                                          "asyncpg")
    harness.emit(result)


if __name__ == "__main__":
    main()
