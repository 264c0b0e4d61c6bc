"""txoutbox on PostgreSQL (asyncpg): `PostgresStorage.insert` in the caller's transaction, and its
`Relay` to a no-op publisher. Runs in txoutbox's own environment."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from typing import Any

import asyncpg
from txoutbox import Relay, RelayConfig
from txoutbox.adapters.postgres import PostgresStorage

from bench.peers import harness


def payload(key: str) -> dict[str, Any]:
    return {"order_id": key, "sku": "SKU-1", "qty": 1}


async def setup(db: harness.Db, prefix: str) -> tuple[asyncpg.Pool, PostgresStorage]:
    pool = await asyncpg.create_pool(db.dsn(), min_size=2, max_size=4)
    storage = PostgresStorage(pool, table=f"{prefix}_outbox")
    await storage.create_schema()
    await pool.execute(f"CREATE TABLE {prefix}_orders (id BIGSERIAL PRIMARY KEY, "
                       "sku VARCHAR(64) NOT NULL, qty INT NOT NULL)")
    return pool, storage


async def teardown(pool: asyncpg.Pool, prefix: str) -> None:
    await pool.execute(f"DROP TABLE IF EXISTS {prefix}_orders, {prefix}_outbox")
    await pool.close()


async def publish(job: dict[str, Any]) -> dict[str, Any]:
    db = harness.Db.from_url(job["url"])
    prefix = job["prefix"]
    pool, storage = await setup(db, prefix)
    insert_order = f"INSERT INTO {prefix}_orders (sku, qty) VALUES ($1, $2)"
    floor_sql = (f"INSERT INTO {prefix}_outbox (topic, key, payload, headers) "
                 "VALUES ($1, $2, $3, $4::jsonb)")

    async def bare(key: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(insert_order, key, 1)

    async def floor(key: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(insert_order, key, 1)
            await conn.execute(floor_sql, "ORDER_CREATED", None,
                               json.dumps(payload(key)).encode(), "{}")

    async def with_publish(key: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(insert_order, key, 1)
            await storage.insert(conn, "ORDER_CREATED", payload(key))

    try:
        runs = await harness.publish_runs_async(
            [("bare", bare), ("floor", floor), ("publish", with_publish)],
            int(job["n"]), int(job["runs"]))
        return {"runs": runs}
    finally:
        await teardown(pool, prefix)


async def drain(job: dict[str, Any]) -> dict[str, Any]:
    db = harness.Db.from_url(job["url"])
    prefix = job["prefix"]
    pool, _ = await setup(db, prefix)
    table = f"{prefix}_outbox"

    async def fill(n: int) -> None:
        await pool.execute(f"TRUNCATE {table}")
        records = [("ORDER_CREATED", None, json.dumps(payload(str(i))).encode(), "{}")
                   for i in range(n)]
        async with pool.acquire() as conn:
            await conn.copy_records_to_table(table, records=records,
                                             columns=["topic", "key", "payload", "headers"])
        await pool.execute(f"ANALYZE {table}")

    async def run(setting: dict[str, Any], n: int) -> tuple[float, int]:
        sent = 0

        async def publisher(message: Any) -> None:
            nonlocal sent
            sent += 1

        storage = PostgresStorage(pool, table=table, strict_ordering=bool(setting["strict"]))
        batch, concurrency = int(setting["batch"]), int(setting["concurrency"])
        # a lease longer than the worst-case round, as its RelayConfig asks
        lease = dt.timedelta(seconds=max(60, -(-batch // concurrency) * 5 + 10))
        relay = Relay(storage, publisher, config=RelayConfig(
            batch_size=batch, concurrency=concurrency, lease=lease))
        t0 = time.perf_counter()
        while (await relay.run_once()).claimed:
            pass
        seconds = time.perf_counter() - t0
        done = await pool.fetchval(f"SELECT count(*) FROM {table} WHERE status = 'done'")
        if done != sent:
            raise SystemExit(f"{sent} published but {done} rows done")
        return seconds, sent

    # drain_runs is synchronous: it runs on a worker thread, each step on this loop
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, lambda: harness.drain_runs(
            job,
            lambda n: asyncio.run_coroutine_threadsafe(fill(n), loop).result(),
            lambda s, n: asyncio.run_coroutine_threadsafe(run(s, n), loop).result()))
    finally:
        await teardown(pool, prefix)


def main() -> None:
    job = harness.read_job()
    result = harness.run_async(publish(job) if job["measure"] == "publish" else drain(job))
    result["versions"] = harness.versions("txoutbox", "asyncpg")
    harness.emit(result)


if __name__ == "__main__":
    main()
