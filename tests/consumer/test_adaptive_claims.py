"""`ConsumerApp(redis_claims="adaptive")`: no Redis claim per message while duplicates are rare
(the processed row decides and serializes), claims back when duplicates grow frequent, and the
same exactly-once effects as the claim-per-message default."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from consumer_kit import ConfigError, ConsumerApp, Message, Outcome, metrics
from consumer_kit.dedupe import Claim, RedisDedupe
from consumer_kit.dedupe.keys import done_key
from consumer_kit.transports import ConsumeStatus
from tests.consumer.conftest import Env, add_reservation, delivery


def count_claims(store: RedisDedupe) -> list[str]:
    """Record every claim the store sends (both the overlapped and the synchronous kind)."""
    seen: list[str] = []
    claim, claim_later = store.claim, store.claim_later

    def counted_claim(message_id: str, token: str) -> Claim:
        seen.append(message_id)
        return claim(message_id, token)

    def counted_later(message_id: str, token: str) -> Any:
        seen.append(message_id)
        return claim_later(message_id, token)

    store.claim = counted_claim  # type: ignore[method-assign]
    store.claim_later = counted_later  # type: ignore[method-assign]
    return seen


def adaptive_app(env: Env, **kwargs: Any) -> ConsumerApp:
    app = env.app(redis_claims="adaptive", local_cache=0, **kwargs)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.id)

    return app


def test_adaptive_claims_send_no_claim_while_duplicates_are_rare_and_still_mark_done(
        env: Env) -> None:
    # Given an adaptive consumer
    app = adaptive_app(env)
    pipeline = app.pipeline()
    assert pipeline.redis is not None
    claims = count_claims(pipeline.redis)
    # When 20 new messages arrive
    outcomes = {pipeline.process(delivery(f"M{i}")).outcome for i in range(20)}
    # Then none asked Redis first, each was applied once, and Redis knows them all as done
    assert outcomes == {Outcome.SUCCEEDED} and claims == []
    assert env.effects() == {f"M{i}": 1 for i in range(20)}
    assert pipeline.redis.flush(5)
    assert all(env.redis.exists(done_key(app.group, f"M{i}")) for i in range(20))
    app.close()


def test_adaptive_claims_come_back_when_duplicates_grow_frequent(env: Env) -> None:
    # Given an adaptive consumer that applied 30 messages (their done markers landed)
    app = adaptive_app(env)
    pipeline = app.pipeline()
    assert pipeline.redis is not None
    for i in range(30):
        assert pipeline.process(delivery(f"M{i}")).outcome is Outcome.SUCCEEDED
    assert pipeline.redis.flush(5)
    claims = count_claims(pipeline.redis)
    # When all 30 are delivered again
    results = [pipeline.process(delivery(f"M{i}")) for i in range(30)]
    # Then every one is a duplicate, applied once: the first five found by the processed row
    # without a claim, the other 25 answered by Redis before the database was touched
    assert {r.outcome for r in results} == {Outcome.DUPLICATE}
    reasons = [r.reason for r in results]
    assert reasons == ["processed row exists"] * 5 + ["done in redis"] * 25
    assert len(claims) == 25
    assert env.effects() == {f"M{i}": 1 for i in range(30)}
    # And when new messages follow, the claims stop again once the duplicates have faded
    claims.clear()
    for i in range(30, 70):
        before = len(claims)
        assert pipeline.process(delivery(f"M{i}")).outcome is Outcome.SUCCEEDED
        if i >= 60:
            assert len(claims) == before, f"message {i} still claimed"
    assert 0 < len(claims) < 40
    app.close()


def test_a_concurrent_delivery_waits_on_the_processed_row_and_ends_a_duplicate(
        real_env: Env) -> None:
    # Given two adaptive consumers of one group, the first one's handler slow
    env = real_env
    started, results, waited = threading.Event(), [], []
    apps = [env.app(redis_claims="adaptive", local_cache=0) for _ in range(2)]
    apps[1].group = apps[0].group

    def handler(slow: bool) -> Any:
        def reserve(msg: Message, session: Any) -> None:
            if slow:
                started.set()
                time.sleep(1.5)
            add_reservation(env, session, "A")
        return reserve

    apps[0].listener("ORDER_CREATED")(handler(True))
    apps[1].listener("ORDER_CREATED")(handler(False))
    first = threading.Thread(target=lambda: results.append(
        apps[0].pipeline().process(delivery("M1"))))
    first.start()
    assert started.wait(5)
    # When the second consumer gets the same message while the first runs it
    t0 = time.monotonic()
    second = apps[1].pipeline().process(delivery("M1"))
    waited.append(time.monotonic() - t0)
    first.join(10)
    # Then it waited for the first one's commit on the processed row's lock and found it done:
    # the effect applied once, no redelivery needed
    assert results[0].outcome is Outcome.SUCCEEDED
    assert second.outcome is Outcome.DUPLICATE, second
    assert waited[0] > 0.8
    assert env.effects() == {"A": 1}
    for app in apps:
        app.close()


def test_a_handler_without_a_session_still_takes_the_lease_in_adaptive_mode(env: Env) -> None:
    # Given an adaptive consumer with a session-less handler, and another consumer holding M1
    app = env.app(redis_claims="adaptive")
    ran: list[str] = []

    @app.listener("ORDER_CREATED")
    def note(msg: Message) -> None:
        ran.append(msg.id)

    store = app.pipeline().redis
    assert store is not None and store.claim("M1", "another-consumer") is Claim.CLAIMED
    # When M1 arrives
    held = app.process(delivery("M1"))
    # Then it is deferred without running (no row lock could serialize a session-less handler)
    assert (held.status, held.spend) == (ConsumeStatus.RECONSUME_LATER, False)
    assert ran == []
    app.close()


def test_redis_down_in_adaptive_mode_stays_exactly_once_and_is_reported(env: Env) -> None:
    # Given an adaptive consumer whose Redis refuses connections
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    app = adaptive_app(env)
    app.redis_config = dead
    pipeline = app.pipeline()
    assert pipeline.redis is not None
    claims = count_claims(pipeline.redis)
    # When a message is delivered three times and the done markers are sent
    outcomes = [pipeline.process(delivery("M1")).outcome for _ in range(3)]
    pipeline.redis.flush(5)
    # Then it was applied once, and the failed batch of markers (no claim was sent) degraded
    # the store: a warning, a metric
    assert outcomes == [Outcome.SUCCEEDED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert claims == []
    assert env.effects() == {"M1": 1}
    assert pipeline.redis.degraded
    assert metrics.DEGRADED.labels(app.group)._value.get() == 1
    app.close()


def test_redis_back_in_adaptive_mode_clears_the_degraded_gauge_without_a_claim(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given an adaptive consumer whose store went degraded (Redis failed a moment ago)
    app = adaptive_app(env)
    pipeline = app.pipeline()
    assert pipeline.redis is not None
    claims = count_claims(pipeline.redis)
    pipeline.redis.retry_after = 0.2
    pipeline.redis.degrade("write", redis.ConnectionError("down for a moment"))
    assert metrics.DEGRADED.labels(app.group)._value.get() == 1
    time.sleep(0.3)
    # When new messages are applied (no claim: duplicates are rare) and their markers land
    for i in range(3):
        assert pipeline.process(delivery(f"M{i}")).outcome is Outcome.SUCCEEDED
    assert pipeline.redis.flush(5)
    # Then the markers' batch told the store Redis is back: the gauge is 0 and it is said
    assert claims == []
    assert metrics.DEGRADED.labels(app.group)._value.get() == 0
    assert "redis is back" in caplog.text
    assert all(env.redis.exists(done_key(app.group, f"M{i}")) for i in range(3))
    app.close()


@pytest.mark.parametrize("mode", ["sometimes", "", "ADAPTIVE", None])
def test_an_unknown_redis_claims_mode_is_refused(mode: Any) -> None:
    with pytest.raises(ConfigError, match="redis_claims must be one of every, adaptive"):
        ConsumerApp(group="inventory", db="sqlite://", redis_claims=mode)
