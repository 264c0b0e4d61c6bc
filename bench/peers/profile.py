"""Where consumer-kit's publish, relay and duplicate rejection spend their time: cProfile of each,
the time split into buckets (waiting on the database, SQLAlchemy, the driver, consumer-kit's own
code, JSON, ...), the statements each one sends, and the top functions. The speed work starts
here.

    python -m bench.peers.profile [--db mysql|postgresql] [--tx 500] [--rows 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import sqlalchemy as sa

from bench.common import machine_facts
from bench.peers.runners.ckit import analyze, orders_table, payload
from bench.peers.runners.ckit_dedupe import delivery
from consumer_kit import ConsumerApp
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import PayloadError
from consumer_kit.core.schema import outbox_table, processed_table
from consumer_kit.outcome import Outcome
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Outbox, Relay
from outbox_producer.ids import new_message_id

URLS = {"mysql": "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_bench",
        "postgresql": os.environ.get("CKIT_TEST_PG_URL",
                                     "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_bench")}

#: (bucket, test on "file:function") in order; the first match wins
BUCKETS: list[tuple[str, Callable[[str], bool]]] = [
    ("waiting on the database (socket/libpq)",
     lambda k: any(s in k for s in ("recv_into", "sendall", "'recv'", "wait_c", "select.",
                                    "poll", "pq.PGconn", "_psycopg",
                                    "psycopg/connection.py:wait"))),
    ("driver (PyMySQL / psycopg, Python part)", lambda k: "/pymysql/" in k or "/psycopg/" in k),
    ("SQLAlchemy: statement building, cache keys, compile",
     lambda k: "/sqlalchemy/sql/" in k),
    ("SQLAlchemy: engine, connection, pool, ORM session",
     lambda k: "/sqlalchemy/" in k),
    ("JSON", lambda k: "/json/" in k or "json" in k.split(":")[-1]),
    ("consumer-kit (outbox_producer, consumer_kit)",
     lambda k: "/outbox_producer/" in k or "/consumer_kit/" in k),
    ("threads, locks, queues", lambda k: "threading" in k or "queue" in k or "lock" in k),
]


def bucket_of(key: str) -> str:
    return next((name for name, test in BUCKETS if test(key)), "other (stdlib, builtins)")


def report(title: str, profile: cProfile.Profile, units: int, unit: str,
           statements: Counter[str], counted: int, top: int) -> None:
    """Buckets, statements (counted over `counted` units in a separate pass) and top
    functions of a profile covering `units` units of work."""
    stats = pstats.Stats(profile)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_bucket: Counter[str] = Counter()
    rows = []
    for (path, line, func), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        key = f"{path}:{func}"
        by_bucket[bucket_of(key)] += tottime
        rows.append((tottime, f"{path.split('site-packages/')[-1]}:{line}({func})"))
    total = sum(by_bucket.values())
    print(f"\n== {title}: {total / units * 1e6:,.0f} us per {unit} under the profiler ==")
    for name, seconds in by_bucket.most_common():
        print(f"  {seconds / total:6.1%}  {seconds / units * 1e6:8.0f} us/{unit}  {name}")
    print(f"  statements per {unit}:")
    for stmt, count in statements.most_common():
        print(f"    {count / counted:8.4f}  {stmt}")
    print(f"  top {top} functions by own time:")
    for tottime, name in sorted(rows, reverse=True)[:top]:
        print(f"    {tottime / units * 1e6:8.1f} us/{unit}  {name}")


def count_statements(engine: sa.engine.Engine, work: Callable[[], object]) -> Counter[str]:
    """The statements and transaction steps `work()` sends, counted by engine events that are
    removed again before anything is profiled (listeners slow SQLAlchemy's execute path)."""
    seen: Counter[str] = Counter()

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen[" ".join(statement.split())[:70]] += 1

    hooks: list[tuple[str, Callable[..., None]]] = [("before_cursor_execute", before)]
    for name in ("begin", "commit", "rollback", "savepoint", "release_savepoint"):
        hooks.append((name, lambda *a, name=name: seen.update([name.upper()])))
    for name, fn in hooks:
        sa.event.listen(engine, name, fn)
    try:
        work()
    finally:
        for name, fn in hooks:
            sa.event.remove(engine, name, fn)
    return seen


def profiled(work: Callable[[], object]) -> cProfile.Profile:
    profile = cProfile.Profile()
    profile.enable()
    try:
        work()
    finally:
        profile.disable()
    return profile


def profile_publish(engine: sa.engine.Engine, prefix: str, n: int, top: int) -> None:
    metadata = sa.MetaData()
    orders = orders_table(metadata, prefix)
    table = outbox_table(metadata, f"{prefix}_outbox")
    metadata.create_all(engine)
    try:
        outbox = Outbox(engine, producer="bench", table=table.name)
        insert_order = orders.insert()

        def tx(key: str) -> None:
            with engine.begin() as conn:
                conn.execute(insert_order, {"sku": key, "qty": 1})
                outbox.publish(conn, "ORDER_CREATED", payload(key), biz_type="order",
                               biz_key=key)

        for i in range(50):
            tx(f"w{i}")
        statements = count_statements(engine, lambda: [tx(f"s{i}") for i in range(n)])
        profile = profiled(lambda: [tx(f"p{i}") for i in range(n)])
        report("publish: one transaction = business INSERT + Outbox.publish (Connection)",
               profile, n, "tx", statements, n, top)
        seconds = timed(lambda k: outbox.publish(None, "T", payload(k), biz_type="x", biz_key=k),
                        n)
        print(f"  publish() before it touches a connection (checks, JSON, ULID, row dict; "
              f"measured by passing None): {seconds * 1e6:,.0f} us per call, no profiler")
    finally:
        metadata.drop_all(engine)


def timed(fn: Callable[[str], object], n: int) -> float:
    """Seconds per call of `fn`, which ends in the PayloadError `publish` raises for a missing
    connection: everything publish does before its first statement."""
    t0 = time.perf_counter()
    for i in range(n):
        with contextlib.suppress(PayloadError):
            fn(f"t{i}")
    return (time.perf_counter() - t0) / n


def profile_relay(engine: sa.engine.Engine, prefix: str, rows: int, batch: int,
                  top: int) -> None:
    metadata = sa.MetaData()
    table = outbox_table(metadata, f"{prefix}_outbox")
    metadata.create_all(engine)
    try:
        stamp = utcnow()
        data = [{"message_id": new_message_id(), "biz_type": "order", "biz_key": str(i),
                 "topic": "ORDER_CREATED", "body": b'{"order_id":1}', "state": 0,
                 "retry_count": 0, "max_retries": 10, "next_retry_at": stamp,
                 "lock_version": 0, "created_by": "bench", "gmt_create": stamp,
                 "gmt_modified": stamp} for i in range(rows)]
        for start in range(0, rows, 5000):
            with engine.begin() as conn:
                conn.execute(table.insert(), data[start:start + 5000])
        analyze(engine, table.name)
        relay = Relay(engine, MemoryTransport(), table=table.name, batch=batch)
        statements = count_statements(
            engine, lambda: Relay(engine, MemoryTransport(), table=table.name,
                                  batch=batch).run(once=True, max_batches=4))
        done: list[Any] = []
        t0 = time.perf_counter()
        profile = profiled(lambda: done.append(relay.run_once()))
        seconds = time.perf_counter() - t0
        result = done[0]
        report(f"relay: run_once over {rows:,} rows, batch {batch} "
               f"({result.stats.sent / seconds:,.0f} rows/s under the profiler)",
               profile, result.stats.sent, "row", statements, 4 * batch, top)
    finally:
        metadata.drop_all(engine)


def profile_duplicates(engine: sa.engine.Engine, prefix: str, n: int, top: int) -> None:
    metadata = sa.MetaData()
    processed = processed_table(metadata, f"{prefix}_processed")
    effects = sa.Table(f"{prefix}_effects", metadata,
                       sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
                       sa.Column("sku", sa.String(64)), sa.Column("qty", sa.Integer))
    metadata.create_all(engine)
    try:
        app = ConsumerApp(group=prefix, db=engine, redis=None, receipts=None,
                          transport="memory://profile", processed_table=processed.name,
                          local_cache=0)
        app.listener("ORDER_CREATED")(
            lambda msg, session: session.execute(effects.insert(), {"sku": "a", "qty": 1}))
        pipe = app.pipeline()
        for i in range(n):
            pipe(delivery(f"d{i}"))
        statements = count_statements(engine, lambda: [pipe(delivery(f"d{i}"))
                                                       for i in range(20)])
        profile = profiled(lambda: [pipe(delivery(f"d{i}")) for i in range(n)])
        report("duplicate rejected by the database only (redis=None, in-process cache off)",
               profile, n, "duplicate", statements, 20, top)
        app.close()
        print(f"  a duplicate rejected by the Redis claim instead: "
              f"{python_per_duplicate(20_000) * 1e6:.1f} us per message of Python (consumer-kit "
              f"and redis-py) around the round trip, measured with a connection that answers "
              f"'done' at once; best of 5 x 20,000, no profiler")
    finally:
        metadata.drop_all(engine)


class AnswersDone(redis.Connection):
    """A Redis connection that sends nothing and answers every command with 1 at once (the
    claim script's "done"): what is left of a duplicate's time is consumer-kit's Python and
    redis-py's, without the round trip."""

    def connect(self) -> None:
        """Nothing to connect to."""

    def can_read(self, timeout: float = 0) -> bool:
        return False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Dropped: nobody listens."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return 1


def python_per_duplicate(n: int) -> float:
    """Seconds per duplicate rejected through the Redis claim (the peer bench's message, the
    default claim mode, one consume thread) with `AnswersDone` instead of a server; no
    profiler."""
    client = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=AnswersDone, socket_timeout=0.5))
    # one in-memory database for every thread (the consume thread's included)
    engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool,
                              connect_args={"check_same_thread": False})
    metadata = sa.MetaData()
    processed_table(metadata, "processed")
    metadata.create_all(engine)
    app = ConsumerApp(group="python", db=engine, redis=client, receipts=None,
                      transport="memory://profile", processed_table="processed", local_cache=0)
    app.listener("ORDER_CREATED")(lambda msg, session: None)
    pipe = app.pipeline()
    timed: list[float] = []

    def consume() -> None:  # on a thread of its own, as a consume thread (the main thread's
        # claims skip the combiner: docs/signals.md)
        deliveries = [delivery(f"p{i}") for i in range(n)]
        for d in deliveries[:50]:  # the first few go to the database too, then Redis first
            pipe(d)
        before = pipe.counts[Outcome.DUPLICATE]
        for _ in range(5):
            t0 = time.perf_counter()
            for d in deliveries:
                pipe(d)
            timed.append((time.perf_counter() - t0) / n)
        if pipe.counts[Outcome.DUPLICATE] - before != 5 * n:
            timed.clear()
            print(f"python_per_duplicate: {pipe.counts} after the warm-up, {5 * n} timed "
                  "deliveries, all meant to be duplicates", file=sys.stderr)

    try:
        worker = threading.Thread(target=consume, name="consume")
        worker.start()
        worker.join()
        if len(timed) != 5:
            raise SystemExit("python_per_duplicate: the consume thread did not finish its runs")
        return min(timed)
    finally:
        app.close()
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers.profile",
                                description=__doc__.splitlines()[0])
    p.add_argument("--db", choices=sorted(URLS), default="mysql")
    p.add_argument("--url", help="override the database URL")
    p.add_argument("--tx", type=int, default=500)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    if args.rows <= 4 * args.batch:  # 4 batches are counted statement by statement first
        p.error(f"--rows {args.rows} leaves nothing to profile: the relay's statements are "
                f"counted on 4 x --batch ({4 * args.batch}) rows first; give more rows")
    engine = make_engine(args.url or URLS[args.db])
    print(machine_facts(engine))
    prefix = f"bench_{uuid.uuid4().hex[:6]}_prof"
    try:
        profile_publish(engine, prefix + "p", args.tx, args.top)
        profile_relay(engine, prefix + "r", args.rows, args.batch, args.top)
        profile_duplicates(engine, prefix + "d", min(args.tx, 300), args.top)
    finally:
        engine.dispose()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    sys.argv[:] = ["-m", "bench.peers.profile", *arguments]  # what machine_facts prints
    main(arguments)
