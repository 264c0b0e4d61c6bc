"""Redis down or flushed: the database path alone keeps effects exactly-once, then recovers."""

from __future__ import annotations

import time
from typing import Any

import redis

from consumer_kit import Message, Outcome, metrics
from consumer_kit.dedupe import Claim, RedisDedupe
from tests.consumer.conftest import Env, add_reservation, delivery


class Switchable(redis.Redis):
    """A real client whose server can be 'down' on demand."""


def test_redis_down_degrades_to_the_database_and_stays_exactly_once(env: Env) -> None:
    # Given: Redis that refuses connections
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    app = env.app(local_cache=0)
    app.redis_config = dead

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    # When
    outcomes = [app.pipeline().process(delivery("M1")).outcome for _ in range(3)]
    # Then
    assert outcomes == [Outcome.SUCCEEDED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert env.effects() == {"A": 1}
    assert app.pipeline().redis is not None and app.pipeline().redis.degraded
    assert metrics.DEGRADED.labels(app.group)._value.get() == 1


def test_redis_recovers_by_itself_after_the_retry_interval(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"), retry_after=0.2)
    store._failed("claim", "M0", redis.ConnectionError("down"))
    assert store.claim("M1", "t") is Claim.UNAVAILABLE
    time.sleep(0.3)
    assert store.claim("M1", "t") is Claim.CLAIMED
    assert not store.degraded


def test_the_claim_script_answers_claimed_busy_and_duplicate(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    assert store.claim("M1", "me") is Claim.CLAIMED  # our own lease again
    assert store.claim("M1", "other") is Claim.BUSY
    store.finish("M1", "me")
    assert store.flush()  # done markers are written off the hot path
    assert store.claim("M1", "other") is Claim.DUPLICATE


def test_release_frees_the_lease_for_a_redelivery(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    store.release("M1", "someone-else")  # not theirs to release
    assert store.flush()
    assert store.claim("M1", "other") is Claim.BUSY
    store.release("M1", "me")
    assert store.flush()
    assert store.claim("M1", "other") is Claim.CLAIMED


def test_done_markers_expire_after_the_ttl(env: Env) -> None:
    import datetime as dt

    store = RedisDedupe(env.redis, env.group("g"), done_ttl=dt.timedelta(milliseconds=200))
    store.claim("M1", "me")
    store.finish("M1", "me")
    assert store.flush()
    assert store.claim("M1", "x") is Claim.DUPLICATE
    time.sleep(0.3)
    assert store.claim("M1", "x") is Claim.CLAIMED


def test_claims_reload_the_script_after_a_script_flush(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    env.redis.script_flush()  # a Redis restart or failover loses loaded scripts
    assert store.claim("M1", "other") is Claim.BUSY
    assert not store.degraded


def test_concurrent_claims_of_one_id_give_one_claim_and_the_rest_busy(env: Env) -> None:
    import threading

    store = RedisDedupe(env.redis, env.group("g"))
    answers: list[Claim] = []
    start = threading.Barrier(12)

    def claim(token: str) -> None:
        start.wait()
        answers.append(store.claim("M1", token))

    threads = [threading.Thread(target=claim, args=(f"t{i}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(a.name for a in answers) == ["BUSY"] * 11 + ["CLAIMED"]
