"""consumer-kit's decorated consumer against the bare handler, driven without a broker as
bench/consumer.py does (`ConsumerApp(...).pipeline()(Delivery(...))`), with Redis and with the
database only; then the rate of rejecting duplicates this process did not see itself, and of
Redis PINGs on the same thread: one round trip, the least a duplicate rejected through Redis
costs (on a virtual machine, mostly the wake-up of a thread blocked on its socket).

The floor: the bare handler plus the processed row written by one hand-written INSERT in the
same transaction. A dedupe whose truth is a row committed with the effect costs at least that
one statement; the report gives what decorating adds over what the floor adds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from bench.peers import harness
from consumer_kit import ConsumerApp, Message
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import processed_table
from consumer_kit.dedupe.keys import done_key, lease_key
from consumer_kit.outcome import Outcome
from consumer_kit.transports import ConsumeStatus, Delivery

#: the pseudo-mode of `duplicate_rates` timing one Redis PING per key
PING = "redis PING"


def delivery(key: str) -> Delivery:
    """One message as a transport hands it over (ckit envelope: the dedupe id is `ckit_id`)."""
    return Delivery(topic="ORDER_CREATED", body=b'{"sku":"%s","qty":1}' % key.encode(),
                    broker_message_id="B" + key, tags="created",
                    properties={"ckit_id": key, "ckit_src": "orders"})


def dedupe(job: dict[str, Any]) -> dict[str, Any]:
    """bare / decorated with Redis (a claim per message, and `redis_claims="adaptive"`) /
    decorated with the database only, interleaved; then duplicates rejected per second by each
    decorated mode."""
    engine = make_engine(job["url"])
    prefix = job["prefix"]
    metadata = sa.MetaData()
    processed = processed_table(metadata, f"{prefix}_processed")
    effects = sa.Table(f"{prefix}_effects", metadata,
                       sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
                       sa.Column("sku", sa.String(64), nullable=False),
                       sa.Column("qty", sa.Integer, nullable=False))
    metadata.create_all(engine)
    insert_effect = effects.insert()

    def handler(msg: Message, session: Session) -> None:
        body = msg.json()
        session.execute(insert_effect, {"sku": body["sku"], "qty": body["qty"]})

    def make_app(group: str, redis: str | None, claims: str = "every") -> ConsumerApp:
        app = ConsumerApp(group=group, db=engine, redis=redis, receipts=None,
                          transport="memory://bench", processed_table=processed.name,
                          local_cache=0, redis_claims=claims)
        app.listener("ORDER_CREATED")(handler)
        return app

    apps = {"redis": make_app(f"{prefix}-redis", job["redis"]),
            "adaptive": make_app(f"{prefix}-adaptive", job["redis"], "adaptive"),
            "database": make_app(f"{prefix}-db", None)}
    pipes = {mode: app.pipeline() for mode, app in apps.items()}

    def bare(key: str) -> None:
        with Session(engine) as session, session.begin():
            handler(Message.from_delivery(delivery(key)), session)

    insert_processed = processed.insert()

    def floor(key: str) -> None:
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        with Session(engine) as session, session.begin():
            session.execute(insert_processed, {
                "consumer_group": "floor", "message_id": key, "topic": "ORDER_CREATED",
                "tags": "created", "broker_message_id": "B" + key, "src": "orders",
                "status": "SUCCEEDED", "attempts": 1, "first_seen_at": now,
                "processed_at": now})
            handler(Message.from_delivery(delivery(key)), session)

    def decorated(mode: str) -> harness.Variant:
        pipe = pipes[mode]

        def run(key: str) -> None:
            status = pipe(delivery(key)).status
            if status is not ConsumeStatus.CONSUME_SUCCESS:
                raise SystemExit(f"{mode}: message {key} ended {status}")
        return run

    keys: list[str] = []
    try:
        runs = harness.dedupe_runs([("bare", bare), ("floor", floor),
                                    ("redis", decorated("redis")),
                                    ("adaptive", decorated("adaptive")),
                                    ("database", decorated("database"))],
                                   int(job["n"]), int(job["runs"]))
        keys = [f"r{run}-{i}" for run in range(int(job["runs"])) for i in range(int(job["n"]))]
        for pipe in pipes.values():
            if pipe.redis is not None:
                pipe.redis.flush(30)  # the done markers land off the hot path
        dup_keys = keys[: int(job["duplicates"])]
        before = {mode: pipe.counts.copy() for mode, pipe in pipes.items()}
        # the floor of a duplicate rejected through Redis: one round trip (a PING per key, on
        # the same thread, taking turns with the modes)
        ping = redis.Redis.from_url(job["redis"], socket_timeout=0.5)
        try:
            rates, passes = harness.on_thread(lambda: harness.duplicate_rates(
                [*((mode, lambda k, p=pipe: p(delivery(k))) for mode, pipe in pipes.items()),
                 (PING, lambda _k: ping.ping())],
                dup_keys, int(job["runs"])))
        finally:
            ping.close()
        ping_rate, ping_runs = rates.pop(PING), passes.pop(PING)
        for mode, pipe in pipes.items():
            rejected = (pipe.counts - before[mode])[Outcome.DUPLICATE]
            expected = harness.duplicates_sent(dup_keys, int(job["runs"]))
            if rejected != expected:
                raise SystemExit(f"{mode}: {rejected} duplicates counted, {expected} sent")
        with engine.connect() as conn:
            made = conn.execute(sa.select(sa.func.count()).select_from(effects)).scalar()
        expected = 5 * (len(keys) + 50)  # bare, floor, three decorated modes, warm-up included
        return {"runs": runs, "duplicates": rates, "duplicates_runs": passes,
                "duplicates_n": len(dup_keys), "ping_rate": ping_rate, "ping_runs": ping_runs,
                "effects": made, "effects_expected": expected}
    finally:
        for mode, app in apps.items():
            app.close()
            if mode != "database":
                forget(job["redis"], f"{prefix}-{mode}", keys, mode)
        metadata.drop_all(engine)
        engine.dispose()


def forget(url: str, group: str, keys: list[str], mode: str) -> None:
    """Delete the bench's Redis keys of one mode's group, its warm-up messages' included
    (never a flush: the server is shared)."""
    client = redis.Redis.from_url(url)
    all_keys = [*keys, *(f"w{i}-{mode}" for i in range(50))]
    for start in range(0, len(all_keys), 1000):
        names = []
        for key in all_keys[start:start + 1000]:
            names += [done_key(group, key), lease_key(group, key)]
        client.delete(*names)
    client.close()
