"""Done markers ride along with the next claim; what no claim carries, the writer thread sends
within its linger; a claim left unread never hands its answer to the thread's next claim."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from consumer_kit.dedupe import Claim, RedisDedupe, scripts
from consumer_kit.dedupe import pending as pending_module
from consumer_kit.dedupe.keys import done_key, lease_key
from consumer_kit.dedupe.scripts import Call, release_kept
from tests import services
from tests.consumer.conftest import Env


def store_without_thread_sends(env: Env) -> RedisDedupe:
    """A store whose writer thread waits far longer than any test step (only claims carry),
    with the done-marker script loaded (a first marker sent by `flush`)."""
    store = RedisDedupe(env.redis, env.group("g"))
    store.writer.linger = 60.0
    store.finish("M0", "me")
    assert store.flush()
    return store


def test_a_queued_done_marker_reaches_redis_with_the_next_claim(env: Env) -> None:
    # Given M1 claimed and finished: its done marker is queued, not sent
    store = store_without_thread_sends(env)
    assert store.claim("M1", "me") is Claim.CLAIMED
    store.finish("M1", "me")
    assert not env.redis.exists(done_key(store.group, "M1"))
    # When the next message's claim goes out and is read
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED
    # Then M1's marker went with it: another consumer is told M1 is done
    assert env.redis.exists(done_key(store.group, "M1"))
    assert store.claim("M1", "other") is Claim.DUPLICATE
    store.close()


def test_a_marker_no_claim_carries_waits_out_the_linger_then_the_thread_sends_it(
        env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"))
    store.writer.linger = 2.0
    try:
        assert store.claim("M1", "me") is Claim.CLAIMED
        store.finish("M1", "me")
        assert not env.redis.exists(done_key(store.group, "M1"))  # queued for a claim first
        deadline = time.monotonic() + 10
        while not env.redis.exists(done_key(store.group, "M1")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert env.redis.exists(done_key(store.group, "M1"))
    finally:
        store.close()


def test_a_carried_marker_refused_for_a_lost_script_is_sent_again(env: Env) -> None:
    # Given a queued marker, and Redis that lost its scripts (a restart, a failover)
    store = store_without_thread_sends(env)
    assert store.claim("M1", "me") is Claim.CLAIMED
    store.finish("M1", "me")
    env.redis.script_flush()
    # When a claim carries it: the claim's script, which would set the marker, meets NOSCRIPT
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED
    # Then the claim went alone (loading the script again) and the marker was queued again:
    # the next claim delivers it (no flush, no writer thread)
    assert not env.redis.exists(done_key(store.group, "M1"))
    assert store.claim_later("M3", "me").result() is Claim.CLAIMED
    assert env.redis.exists(done_key(store.group, "M1"))
    assert store.claim("M1", "other") is Claim.DUPLICATE
    assert not store.degraded
    store.close()


def test_a_claim_left_unread_is_read_before_the_threads_next_claim(env: Env) -> None:
    # Given M1 done elsewhere, and M2 free
    store = store_without_thread_sends(env)
    other = RedisDedupe(env.redis, store.group)
    assert other.claim("M1", "them") is Claim.CLAIMED
    other.finish("M1", "them")
    assert other.flush()
    # When M1's claim is sent, left unread, and M2's claim follows on the same thread
    first = store.claim_later("M1", "me")
    second = store.claim_later("M2", "me")
    # Then each gets its own answer
    assert second.result() is Claim.CLAIMED
    assert first.result() is Claim.DUPLICATE
    store.close()
    other.close()


def test_a_claim_whose_connection_breaks_degrades_and_the_next_claim_reconnects(
        env: Env) -> None:
    store = RedisDedupe(env.redis, env.group("g"), retry_after=0.1)
    pending = store.claim_later("M1", "me")
    pending._conn.disconnect()  # the socket dies between the send and the read
    assert pending.result() is Claim.UNAVAILABLE
    assert store.degraded
    time.sleep(0.15)
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED
    assert not store.degraded
    store.close()


def test_markers_after_close_are_dropped_and_counted_and_the_thread_is_gone(
        env: Env) -> None:
    store = store_without_thread_sends(env)
    store.close()
    assert not store.writer._thread.is_alive()
    store.finish("M1", "me")
    assert store.writer.dropped == 1 and not store.writer._calls


def test_a_claim_interrupted_mid_read_answers_unavailable_when_asked_again(env: Env) -> None:
    class Interrupted(BaseException):  # like KeyboardInterrupt, not an Exception
        pass

    store = store_without_thread_sends(env)
    pending = store.claim_later("M1", "me")
    conn = pending._conn
    real = conn.read_response

    def interrupted(*args: object, **kwargs: object) -> object:
        conn.read_response = real  # once
        raise Interrupted

    conn.read_response = interrupted
    with contextlib.suppress(Interrupted):
        pending.result()
    assert pending.result() is Claim.UNAVAILABLE  # not an AttributeError on the dropped socket
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED  # the thread reconnects
    store.close()


def test_a_full_queue_drops_markers_and_counts_them(env: Env) -> None:
    store = store_without_thread_sends(env)
    store.writer.max_queued = 2
    for i in range(1, 4):
        store.finish(f"M{i}", "me")
    assert store.writer.dropped == 1
    assert store.flush()
    assert [bool(env.redis.exists(done_key(store.group, f"M{i}"))) for i in range(1, 4)] == [
        True, True, False]
    store.close()


def test_the_markers_a_claim_carries_run_in_its_script_with_one_answer(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given three finished messages whose markers are queued
    store = store_without_thread_sends(env)
    for i in range(1, 4):
        assert store.claim(f"M{i}", "me") is Claim.CLAIMED
        store.finish(f"M{i}", "me")
    sent: list[int] = []

    def pack_calls(conn: Any, calls: Sequence[Call]) -> list[bytes]:
        sent.append(len(calls))
        return scripts.pack_calls(conn, calls)

    monkeypatch.setattr(pending_module, "pack_calls", pack_calls)
    # When the claim that carries them is sent and read
    pending = store.claim_later("M4", "me")
    assert pending.result() is Claim.CLAIMED
    assert sent == [1]  # one script call, so one answer
    # Then every marker is set and its lease dropped, and the claim holds M4's lease
    for i in range(1, 4):
        assert env.redis.exists(done_key(store.group, f"M{i}"))
        assert not env.redis.exists(lease_key(store.group, f"M{i}"))
    assert env.redis.get(lease_key(store.group, "M4")) == b"me"
    assert store.claim_later("M5", "me").result() is Claim.CLAIMED  # the connection is in step
    store.close()


def test_a_carried_marker_that_fails_is_its_own_and_the_claim_still_answers(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given two queued markers, the first one's lease key holding a list (WRONGTYPE for GET)
    store = store_without_thread_sends(env)
    for i in (1, 2):
        assert store.claim(f"M{i}", "me") is Claim.CLAIMED
        store.finish(f"M{i}", "me")
    env.redis.delete(lease_key(store.group, "M1"))
    env.redis.rpush(lease_key(store.group, "M1"), "x")
    # When a claim carries them
    with caplog.at_level(logging.WARNING, logger="consumer_kit.dedupe.pending"):
        answer = store.claim_later("M3", "me").result()
    # Then the claim is answered, the other marker applied, and the failure said once
    assert answer is Claim.CLAIMED
    assert env.redis.exists(done_key(store.group, "M2"))
    assert not env.redis.exists(lease_key(store.group, "M2"))
    warned = [r.getMessage() for r in caplog.records if "done marker failed" in r.getMessage()]
    assert len(warned) == 1 and "1 of 2" in warned[0] and "WRONGTYPE" in warned[0]
    assert not store.degraded
    env.redis.delete(lease_key(store.group, "M1"))
    store.close()


def test_a_claim_carries_nothing_but_done_markers(env: Env) -> None:
    store = store_without_thread_sends(env)
    release = (store._release, [lease_key(store.group, "M1")], ["me"])
    with pytest.raises(ValueError, match="done markers only"):
        store.claim_call("M2", "me", [release])
    store.close()


@pytest.mark.redis
@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}],
                         ids=["decoded-replies", "resp3"])
def test_a_claim_carrying_markers_reads_its_one_answer_whatever_the_clients_replies(
        options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    services.require("redis", services.ping_redis)
    client = redis.Redis.from_url(services.redis_url(), **options)
    store = RedisDedupe(client, "riders-" + uuid.uuid4().hex[:8])
    store.writer.linger = 60.0
    try:
        assert store.claim("M1", "me") is Claim.CLAIMED
        store.finish("M1", "me")
        client.rpush(lease_key(store.group, "M2"), "x")  # M2's marker will fail (WRONGTYPE)
        store.finish("M2", "me")
        with caplog.at_level(logging.WARNING, logger="consumer_kit.dedupe.pending"):
            assert store.claim_later("M3", "me").result() is Claim.CLAIMED
        assert client.exists(done_key(store.group, "M1"))
        assert not client.exists(lease_key(store.group, "M1"))
        assert any("1 of 2" in r.getMessage() and "WRONGTYPE" in r.getMessage()
                   for r in caplog.records)
        assert store.claim_later("M4", "me").result() is Claim.CLAIMED
    finally:
        store.close()
        client.delete(*[key(store.group, f"M{i}") for i in range(1, 5)
                        for key in (done_key, lease_key)])
        release_kept(client.connection_pool)
        client.close()
