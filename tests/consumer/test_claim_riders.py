"""Done markers ride along with the next claim; what no claim carries, the writer thread sends
within its linger; a claim left unread never hands its answer to the thread's next claim."""

from __future__ import annotations

import contextlib
import time

from consumer_kit.dedupe import Claim, RedisDedupe
from consumer_kit.dedupe.keys import done_key
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
    # When a claim carries it: both the marker and the claim meet NOSCRIPT
    assert store.claim_later("M2", "me").result() is Claim.CLAIMED
    # Then the claim's thread loaded the script again and queued the marker: the next claim
    # delivers it (no flush, no writer thread)
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
