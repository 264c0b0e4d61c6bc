"""Consumer overhead on real MariaDB + Redis: a handler doing one business INSERT, decorated
(Redis claim, processed row in the same transaction, done marker) versus the same INSERT bare.

    python bench/consumer.py [--messages 2000]

Bare and decorated runs are interleaved message by message, so machine noise hits both alike;
the overhead percentiles are of the paired differences. Then the duplicate path: ids another
consumer already finished (done markers in Redis) delivered from 1 to 64 callback threads,
rejected via Redis (in-process cache off; concurrent claims share a pipelined round trip), and
via the in-process cache (ids this process finished itself).
Targets: decorated <= 1.25x bare (with Redis: at most the database-only cost); >= 20,000
duplicates/s rejected by one process, >= 10x the database-only rate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts, percentile
from consumer_kit import ConsumerApp, Message
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.dedupe.keys import done_key
from consumer_kit.dedupe.packer import client_options
from consumer_kit.receipts import ReceiptSender, SqlRoute
from consumer_kit.transports import Delivery

MYSQL = os.environ.get("CKIT_TEST_MYSQL_URL", "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test")
REDIS = os.environ.get("CKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def deliveries(n: int, tag: str) -> list[Delivery]:
    return [Delivery(topic="ORDER_CREATED", body=b'{"sku":"SKU-%d","qty":1}' % i,
                     broker_message_id=f"B{tag}{i}", tags="created",
                     properties={"ckit_id": f"{tag}-{i}", "ckit_src": "orders"})
            for i in range(n)]


def duplicate_rate(pipeline: Any, batch: list[Delivery], threads: int, rounds: int = 3) -> float:
    """Deliver every message of `batch` again `rounds` times from `threads` callback threads
    (as a transport's consumer threads would); return duplicates rejected per second."""
    import threading

    parts = [batch[i::threads] for i in range(threads)]

    def work(part: list[Delivery]) -> None:
        for _ in range(rounds):
            for d in part:
                pipeline(d)

    workers = [threading.Thread(target=work, args=(part,)) for part in parts]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return rounds * len(batch) / (time.perf_counter() - t0)


def interleaved(first: Callable[[Delivery], Any], second: Callable[[Delivery], Any],
                batch: list[Delivery]) -> tuple[list[float], list[float]]:
    """Seconds of `first(d)` and `second(d)` for each delivery, run back to back so machine
    noise hits both alike."""
    first_t: list[float] = []
    second_t: list[float] = []
    for d in batch:
        t0 = time.perf_counter()
        first(d)
        t1 = time.perf_counter()
        second(d)
        second_t.append(time.perf_counter() - t1)
        first_t.append(t1 - t0)
    return first_t, second_t


def receipts_rate(app: ConsumerApp, n: int, tag: str) -> None:
    """Receipts one consumer process ships per second: `n` fresh messages through the
    pipeline, then the time until the background sender has delivered every receipt into the
    producer's receipt table (one UPDATE per batch marks them sent)."""
    pipeline = app.pipeline()
    sender = pipeline.receipts
    assert sender is not None
    assert sender.flush(60)
    before = sender.delivered
    batch = deliveries(n, "rc" + tag)
    t0 = time.perf_counter()
    for d in batch:
        pipeline(d)
    handled = time.perf_counter() - t0
    assert sender.flush(120)
    elapsed = time.perf_counter() - t0
    shipped = sender.delivered - before
    print(f"  receipts: {shipped} delivered by one consumer process in {elapsed:.2f}s "
          f"({shipped / elapsed:,.0f}/s, handlers {n / handled:,.0f} msg/s); still owed: "
          f"{pipeline.store.owed()}")
    # the sender's own capacity: a backlog of receipts owed (a consumer restarted after the
    # producer was away), shipped by one sender thread
    store = pipeline.store
    backlog = 20 * n
    now = utcnow() - dt.timedelta(minutes=1)
    rows = [{"consumer_group": store.group, "message_id": f"owed-{tag}-{i}", "topic": "T",
             "src": "orders", "status": "SUCCEEDED", "attempts": 1, "first_seen_at": now,
             "processed_at": now, "receipt_due_at": now, "receipt_attempts": 0}
            for i in range(backlog)]
    with store.engine.begin() as conn:
        for i in range(0, backlog, 5000):
            conn.execute(sa.insert(store.table), rows[i:i + 5000])
    route = SqlRoute(MYSQL, outbox_table=app.receipt_tables[0],
                     receipt_table=app.receipt_tables[1])
    t0 = time.perf_counter()
    drainer = ReceiptSender(route, store, scan_every=0.01, grace=dt.timedelta(0))
    while store.owed() and time.perf_counter() - t0 < 300:
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    drainer.close()
    print(f"  receipts: a backlog of {backlog} owed receipts shipped by one sender in "
          f"{elapsed:.2f}s: {backlog / elapsed:,.0f}/s")


def mark_done(client: redis.Redis, group: str, batch: list[Delivery]) -> None:
    """Write the done markers of `batch` for `group`, as if another consumer processed them."""
    pipe = client.pipeline(transaction=False)
    for d in batch:
        pipe.set(done_key(group, d.properties["ckit_id"]), 1, ex=3600)
    pipe.execute()


def redis_round_trips(url: str, n: int = 3000) -> tuple[float, float]:
    """p50 seconds of a PING over a raw socket and through redis-py: the floor under one
    Redis round trip per duplicate."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    raw: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        sock.recv(64)
        raw.append(time.perf_counter() - t0)
    sock.close()
    client = redis.Redis.from_url(url)
    via_client: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.ping()
        via_client.append(time.perf_counter() - t0)
    return percentile(raw, 50), percentile(via_client, 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    n = args.messages
    engine = make_engine(MYSQL)
    tag = uuid.uuid4().hex[:6]
    names = TableNames(processed=f"bench_{tag}_processed", outbox=f"bench_{tag}_outbox",
                       receipts=f"bench_{tag}_receipts")
    metadata = build_metadata(names, include_transport=False)
    outbox, receipt_rows = metadata.tables[names.outbox], metadata.tables[names.receipts]
    stock = sa.Table(f"bench_{tag}_stock", metadata,
                     sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
                     sa.Column("sku", sa.String(32), nullable=False),
                     sa.Column("qty", sa.Integer, nullable=False))
    metadata.create_all(engine)
    client = redis.Redis.from_url(REDIS, socket_timeout=0.5,  # as ConsumerApp makes it
                                  **client_options())

    def make_app(local_cache: int, use_redis: bool = True, group: str = "",
                 receipts: bool = False, claims: str = "every") -> ConsumerApp:
        app = ConsumerApp(group=group or f"bench-{tag}", db=engine, redis_claims=claims,
                          redis=client if use_redis else None,
                          receipts=MYSQL if receipts else None, receipt_outbox_table=outbox.name,
                          receipt_table=receipt_rows.name, transport="memory://bench",
                          processed_table=names.processed, local_cache=local_cache)

        app.listener("ORDER_CREATED")(handler)
        return app

    def handler(msg: Any, session: Any) -> None:
        body = msg.json()
        session.execute(sa.insert(stock).values(sku=body["sku"], qty=body["qty"]))

    def bare(delivery: Delivery) -> None:
        """The same handler without the framework: its own session and transaction."""
        with Session(engine) as session, session.begin():
            handler(Message.from_delivery(delivery), session)

    try:
        print(machine_facts(engine))
        raw_rtt, client_rtt = redis_round_trips(REDIS)
        print(f"redis   : {client.info('server')['redis_version']}; PING round trip p50 "
              f"{raw_rtt * 1e6:.0f} us raw socket, {client_rtt * 1e6:.0f} us through redis-py")
        app = make_app(local_cache=0, receipts=True)
        pipeline = app.pipeline()
        batch = deliveries(n, tag)
        for d in deliveries(50, "warm" + tag):  # warm pools and scripts
            bare(d)
            pipeline(d)
        bare_t, deco_t = interleaved(bare, pipeline, batch)
        diffs = [d - b for b, d in zip(bare_t, deco_t)]
        ratio = statistics.fmean(deco_t) / statistics.fmean(bare_t)
        print(f"\nhandler with one INSERT, {n} messages, interleaved (decorated: Redis, the "
              "processed row, and a receipt owed to the producer's outbox, shipped by the "
              "background sender):")
        for label, times in (("bare     ", bare_t), ("decorated", deco_t)):
            print(f"  {label} : p50 {percentile(times, 50) * 1e3:.2f} ms  "
                  f"p99 {percentile(times, 99) * 1e3:.2f} ms  "
                  f"mean {statistics.fmean(times) * 1e3:.2f} ms")
        print(f"  ratio decorated/bare (means): {ratio:.2f}x   (p50 ratio "
              f"{percentile(deco_t, 50) / percentile(bare_t, 50):.2f}x; target <= 1.3x)")
        print(f"  added overhead per message  : p50 {percentile(diffs, 50) * 1e6:.0f} us  "
              f"p99 {percentile(diffs, 99) * 1e6:.0f} us")
        db_only = make_app(local_cache=0, use_redis=False, group=f"bench-db-{tag}").pipeline()
        bare_t2, db_t = interleaved(bare, db_only, deliveries(n, "db" + tag))
        print(f"  database-only dedupe (redis=None): ratio "
              f"{statistics.fmean(db_t) / statistics.fmean(bare_t2):.2f}x, added p50 "
              f"{(percentile(db_t, 50) - percentile(bare_t2, 50)) * 1e6:.0f} us")
        adaptive = make_app(local_cache=0, receipts=True, group=f"bench-ad-{tag}",
                            claims="adaptive").pipeline()
        bare_t3, ad_t = interleaved(bare, adaptive, deliveries(n, "ad" + tag))
        print(f"  Redis with redis_claims='adaptive' (no claim while duplicates are rare, a "
              f"receipt owed): ratio {statistics.fmean(ad_t) / statistics.fmean(bare_t3):.2f}x, "
              f"added p50 {(percentile(ad_t, 50) - percentile(bare_t3, 50)) * 1e6:.0f} us")
        receipts_rate(app, n, tag)
        with engine.connect() as conn:
            effects = conn.execute(sa.select(sa.func.count()).select_from(stock)).scalar()
        expected = 7 * n + 100  # three interleaved pairs, the receipts run, the warm-up
        print(f"  effects written: {effects} (expected {expected}: bare and decorated three "
              f"times, {n} for the receipts, 100 warm-up)")

        big = deliveries(max(n, 20_000), "dup" + tag)
        db_dups = deliveries(min(n, 2000), "dbdup" + tag)
        db_app = make_app(local_cache=0, use_redis=False, group=f"bench-dbdup-{tag}").pipeline()
        for d in db_dups:  # processed once: every later delivery is a duplicate
            db_app(d)
        db_rate = duplicate_rate(db_app, db_dups, 20, rounds=1)
        print(f"\nduplicates rejected by the database only (redis=None), 20 threads: "
              f"{db_rate:,.0f}/s (the baseline of the Redis figures' 'vs database' column)")
        baseline = 0.0
        for label, local, threads in (("via redis, 20 threads, combining off", -1,
                                       20),
                                      ("via redis, 1 thread", 0, 1),
                                      ("via redis, 4 threads (the app default)", 0, 4),
                                      ("via redis, 20 threads (RocketMQ's consumeThreadMin)",
                                       0, 20),
                                      ("via redis, 64 threads", 0, 64),
                                      ("via the in-process cache, 1 thread", 100_000, 1)):
            dup = make_app(local_cache=max(local, 0)).pipeline()
            if local < 0 and dup.redis is not None:  # one round trip per claim, as before
                dup.redis._claims.max_batch = 1
            mark_done(client, dup.group, big)
            if local > 0:
                for d in big:  # this process saw them: fill its memory of finished ids
                    dup.recent.add(d.properties["ckit_id"])
            combiner = dup.redis._claims if dup.redis is not None else None
            before = (combiner.batches, combiner.items) if combiner else (0, 0)
            rate = duplicate_rate(dup, big, threads, rounds=1)
            baseline = baseline or rate
            per_trip = (f"  {rate / db_rate:.1f}x the database only; {rate / baseline:.2f}x "
                        "combining off")
            if combiner and combiner.batches > before[0]:
                claims = (combiner.items - before[1]) / (combiner.batches - before[0])
                per_trip += f" ({claims:.1f} claims per round trip)"
            print(f"duplicates rejected {label}: {rate:,.0f}/s{per_trip}")
        print("  (targets >= 20,000/s and >= 10x the database only; concurrent claims share one "
              "pipelined round trip)")
    finally:
        metadata.drop_all(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
