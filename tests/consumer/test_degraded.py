"""Redis down or flushed: the database path alone keeps effects exactly-once, then recovers."""

from __future__ import annotations

import time
from typing import Any

import redis

from consumer_kit import Message, Outcome, metrics
from consumer_kit.dedupe import Claim, RedisDedupe
from tests.consumer.conftest import Env, add_reservation, delivery


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
    store = RedisDedupe(env.redis, env.group("g"), retry_after=1.0)
    store._failed("claim", "M0", redis.ConnectionError("down"))
    assert store.claim("M1", "t") is Claim.UNAVAILABLE
    time.sleep(1.1)
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

    store = RedisDedupe(env.redis, env.group("g"), done_ttl=dt.timedelta(seconds=1))
    store.claim("M1", "me")
    store.finish("M1", "me")
    assert store.flush()
    assert store.claim("M1", "x") is Claim.DUPLICATE
    time.sleep(1.1)
    assert store.claim("M1", "x") is Claim.CLAIMED


def slow_claims(store: RedisDedupe, delay: float = 0.05) -> None:
    """Make each claim round trip slow, so concurrent claims queue and share the next one."""
    send = store._claims.send

    def slow(items: Any) -> Any:
        time.sleep(delay)
        return send(items)

    store._claims.send = slow


def claim_all(store: RedisDedupe, claims: dict[str, str]) -> dict[str, Claim]:
    """Claim every (message id -> token) from its own thread, all at once."""
    import threading

    answers: dict[str, Claim] = {}
    start = threading.Barrier(len(claims))

    def claim(message_id: str, token: str) -> None:
        start.wait()
        answers[message_id] = store.claim(message_id, token)

    threads = [threading.Thread(target=claim, args=item, daemon=True) for item in claims.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return answers


def test_concurrent_claims_share_round_trips_and_each_caller_gets_its_own_answer(
        env: Env) -> None:
    # Given ids already done, ids leased by another consumer, and free ids
    store = RedisDedupe(env.redis, env.group("g"))
    other = RedisDedupe(env.redis, store.group)
    for i in range(4):
        other.claim(f"done{i}", "them")
        other.finish(f"done{i}", "them")
        other.claim(f"leased{i}", "them")
    assert other.flush()
    slow_claims(store)
    claims = {f"{kind}{i}": f"me{i}" for kind in ("done", "leased", "free") for i in range(4)}

    # When 12 threads claim at once
    answers = claim_all(store, claims)

    # Then each got the answer for its own id, in fewer round trips than claims
    assert answers == {m: {"done": Claim.DUPLICATE, "leased": Claim.BUSY,
                           "free": Claim.CLAIMED}[m.rstrip("0123456789")] for m in claims}
    assert store._claims.batches < len(claims)


def test_a_claim_failing_on_its_own_key_does_not_fail_its_batch_or_degrade(env: Env) -> None:
    from consumer_kit.dedupe.keys import lease_key

    store = RedisDedupe(env.redis, env.group("g"))
    env.redis.rpush(lease_key(store.group, "broken"), "x")  # WRONGTYPE for the lease check
    slow_claims(store)
    answers = claim_all(store, {"broken": "me", "fine1": "me", "fine2": "me"})
    assert answers == {"broken": Claim.UNAVAILABLE, "fine1": Claim.CLAIMED,
                       "fine2": Claim.CLAIMED}
    assert not store.degraded


def test_claims_reload_the_script_after_a_script_flush(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    env.redis.script_flush()  # a Redis restart or failover loses loaded scripts
    assert store.claim("M1", "other") is Claim.BUSY
    env.redis.script_flush()
    slow_claims(store)
    answers = claim_all(store, {"M1": "other", "M2": "me", "M3": "me"})  # several in one batch
    assert answers == {"M1": Claim.BUSY, "M2": Claim.CLAIMED, "M3": Claim.CLAIMED}
    assert not store.degraded


def test_done_markers_and_releases_survive_a_script_flush(env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    assert store.claim("M2", "me") is Claim.CLAIMED
    env.redis.script_flush()
    store.finish("M1", "me")  # pipelined by the writer thread
    assert store.flush()
    store.release("M2", "me")  # synchronous
    assert store.claim("M1", "other") is Claim.DUPLICATE
    assert store.claim("M2", "other") is Claim.CLAIMED
    assert not store.degraded


def test_a_claim_whose_connection_drops_is_sent_again_through_the_pipeline(
        env: Env, monkeypatch: Any) -> None:
    # Given: the single-call fast path's connection fails once mid-send
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    real = redis.connection.Connection.send_packed_command
    failures = []

    def drop_once(self: Any, command: Any, *args: Any, **kwargs: Any) -> None:
        if not failures:
            failures.append(b"".join(command).split(b"\r\n")[2])  # the command's name
            raise redis.exceptions.ConnectionError("connection reset by peer")
        real(self, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", drop_once)
    # When: the next claims run
    answers = [store.claim("M1", "other"), store.claim("M2", "me")]
    # Then: each still gets its answer, and Redis is not counted down
    assert failures == [b"EVALSHA"]
    assert answers == [Claim.BUSY, Claim.CLAIMED]
    assert not store.degraded


def test_a_claim_after_redis_dropped_the_threads_connection_still_gets_its_answer(
        env: Env) -> None:
    import fakeredis

    # Given: this thread's claim connection is open, and Redis then drops every client
    # (a restart, a failover, a proxy timing the connection out; fakeredis: the pool closes
    # its connections, this thread's kept one included)
    store = RedisDedupe(env.redis, env.group("g"))
    assert store.claim("M1", "me") is Claim.CLAIMED
    if isinstance(env.redis, fakeredis.FakeRedis):
        env.redis.connection_pool.disconnect()
    else:
        env.redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    # When / Then: the next claims still get their answers, and Redis is not counted down
    assert [store.claim("M1", "other"), store.claim("M2", "me")] == [Claim.BUSY, Claim.CLAIMED]
    assert not store.degraded


def test_an_answer_to_a_claim_sent_before_redis_failed_does_not_end_the_degraded_mode(
        real_env: Env) -> None:
    env = real_env  # a claim on the wire needs a real Redis socket
    # Given a claim on the wire, and Redis failing for another thread before its answer is read
    # (the answer was already in the socket's buffer)
    from consumer_kit.dedupe.pending import PendingClaim

    store = RedisDedupe(env.redis, env.group("g"), retry_after=60.0)
    pending = PendingClaim(store, "M1", "t")
    store.failed("claim", "M2", redis.ConnectionError("connection reset"))
    # When the early claim's answer is read
    assert pending.result() is Claim.CLAIMED
    # Then Redis still counts as down: that answer says nothing of after the failure
    assert store.degraded
    assert metrics.DEGRADED.labels(store.group)._value.get() == 1
    # while an answer to a request sent after the failure ends it
    store.ok(store.failures)
    assert not store.degraded
    assert metrics.DEGRADED.labels(store.group)._value.get() == 0
