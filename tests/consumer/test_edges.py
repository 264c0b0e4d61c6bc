"""The consumer's edges: nothing recorded as done that did not run, every listener reachable,
and a handler deadline that rolls back and redelivers while no second consumer starts it."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import pytest

from consumer_kit import Message, Reject
from consumer_kit.core.errors import ConfigError, HandlerSignatureError
from consumer_kit.core.messages import ConsumeStatus, Delivery
from consumer_kit.dedupe.keys import done_key
from consumer_kit.metrics import HANDLER_TIMEOUTS
from consumer_kit.outcome import Outcome
from tests.consumer.conftest import Env, add_reservation, delivery


def test_an_async_handler_is_refused_at_registration_not_recorded_as_done(env: Env) -> None:
    app = env.app()

    async def reserve(msg: Message, session: Any) -> None:  # its coroutine would never run
        add_reservation(env, session, "A")

    class Handler:
        async def __call__(self, msg: Message) -> None:
            pass

    with pytest.raises(HandlerSignatureError, match="async"):
        app.listener("ORDER_CREATED")(reserve)
    with pytest.raises(HandlerSignatureError, match="async"):
        app.listener("ORDER_CREATED")(Handler())
    assert app.router.listeners == []


def test_an_empty_topic_is_refused(env: Env) -> None:
    with pytest.raises(ConfigError, match="non-empty string"):
        env.app().listener("")(lambda msg: None)


@pytest.mark.parametrize("order", ["star first", "tag first"])
def test_a_tagged_listener_is_reached_whatever_the_order_of_registration(
        env: Env, order: str) -> None:
    # Given a "*" listener and a "created" listener of one topic
    app = env.app()
    seen: list[str] = []
    star = ("*", lambda msg: seen.append("star"))
    tagged = ("created", lambda msg: seen.append("created"))
    for tags, fn in ([star, tagged] if order == "star first" else [tagged, star]):
        app.listener("ORDER_CREATED", tags=tags)(fn)
    # When messages of each tag arrive
    app.process(delivery("M1", tags="created"))
    app.process(delivery("M2", tags="paid"))
    # Then each went to its own listener
    assert seen == ["created", "star"]


def test_two_listeners_claiming_one_tag_are_refused(env: Env) -> None:
    app = env.app()
    app.listener("ORDER_CREATED", tags="a || b")(lambda msg: None)
    with pytest.raises(ConfigError, match="could never receive them"):
        app.listener("ORDER_CREATED", tags="b")(lambda msg: None)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10s"])
def test_a_bad_timeout_is_refused(env: Env, bad: object) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        env.app().listener("T", timeout=bad)(lambda msg: None)


def test_a_handler_past_its_timeout_is_rolled_back_counted_and_redelivered(env: Env) -> None:
    # Given a handler that is slow the first time
    app = env.app()
    calls: list[int] = []

    @app.listener("ORDER_CREATED", timeout=0.3)
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.8)

    before = HANDLER_TIMEOUTS.labels(app.group, "ORDER_CREATED")._value.get()
    # When it runs past its timeout
    first = app.pipeline().process(delivery("M1"))
    # Then its transaction was rolled back, the broker redelivers, the timeout was counted
    assert first.outcome is Outcome.RETRY and "past its timeout of 0.3s" in str(first.reason)
    assert env.effects() == {}
    assert HANDLER_TIMEOUTS.labels(app.group, "ORDER_CREATED")._value.get() == before + 1
    # and the redelivery applies it once
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}
    app.close()


def test_a_handler_without_a_session_past_its_timeout_is_never_said_to_be_rolled_back(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a slow handler without a session (nothing to roll back: its effect stays)
    app = env.app()
    done: list[str] = []

    @app.listener("ORDER_CREATED", timeout=0.2)
    def notify(msg: Message) -> None:
        time.sleep(0.9)  # long enough for the watchdog to report it while it runs
        done.append(msg.id)

    # When it runs past its timeout
    with caplog.at_level(logging.WARNING):
        result = app.pipeline().process(delivery("M1"))
    # Then it is recorded done, and no line says it was rolled back or will be redelivered
    assert result.outcome is Outcome.SUCCEEDED and done == ["M1"]
    lines = [r.getMessage() for r in caplog.records if "past its timeout" in r.getMessage()]
    assert lines and all("effect stays" in line for line in lines), lines
    assert not any("rolled back" in line or "redelivered" in line for line in lines), lines
    app.close()


def test_the_handler_lease_is_renewed_so_no_second_consumer_starts_a_slow_handler(
        env: Env) -> None:
    # Given two consumers of one group with a short handler lease, the first one slow
    import datetime as dt

    slow_started, claimed = threading.Event(), threading.Event()
    apps = [env.app(lease=dt.timedelta(seconds=1)) for _ in range(2)]
    # (env.app gives each its own group name; make them one group)
    apps[1].group = apps[0].group

    def handler(slow: bool) -> Any:
        def reserve(msg: Message, session: Any) -> None:
            if slow:
                slow_started.set()
                claimed.wait(10)  # runs until the second consumer has tried its claim
            add_reservation(env, session, "A")
        return reserve

    apps[0].listener("ORDER_CREATED", timeout=10)(handler(True))
    apps[1].listener("ORDER_CREATED", timeout=10)(handler(False))
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(
        apps[0].pipeline().process(delivery("M1"))))
    worker.start()
    try:
        assert slow_started.wait(5)
        time.sleep(1.6)  # longer than the lease: only a renewal keeps it
        # When the second consumer tries to claim the same message meanwhile
        from consumer_kit.dedupe import Claim

        second_redis = apps[1].pipeline().redis
        assert second_redis is not None
        claim = second_redis.claim("M1", "second-consumer")
    finally:
        claimed.set()
    worker.join(10)
    # Then Redis says another consumer holds it (the broker redelivers later), and the
    # effect is applied once
    assert claim is Claim.BUSY
    assert results[0].outcome is Outcome.SUCCEEDED
    assert env.effects() == {"A": 1}
    for app in apps:
        app.close()


def test_messages_from_other_producers_owe_no_receipt_and_make_no_noise(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    app = env.app(receipts="topic")

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    plain = Delivery("ORDER_CREATED", b"{}", "UNIQ1", tags="created", keys="order-7")
    assert app.process(plain).status is ConsumeStatus.CONSUME_SUCCESS
    assert app.pipeline().store.owed() == 0
    assert "receipt" not in caplog.text.lower()
    app.close()


def test_a_consumer_stopped_with_a_handler_still_running_says_it_left_it_behind() -> None:
    # Given a consumer whose only handler takes longer than the shutdown allows
    from consumer_kit.core.messages import OutgoingMessage, Subscription
    from consumer_kit.transports.memory import MemoryTransport
    from consumer_kit.transports.running import run_consumer

    transport = MemoryTransport()
    started = threading.Event()

    def slow(_d: Delivery) -> ConsumeStatus:
        started.set()
        time.sleep(3)
        return ConsumeStatus.CONSUME_SUCCESS

    transport.send(OutgoingMessage("T", b"x"))
    consumer = transport.consumer("g", [Subscription("T")], slow)
    # When it is stopped after half a second
    left = run_consumer(consumer, threading.Event(), max_seconds=0.5, shutdown_timeout=0.5)
    # Then it says one handler was left running
    assert started.is_set() and left == 1


def test_redis_still_answers_a_duplicate_whose_processed_row_is_gone_when_claims_overlap(
        env: Env) -> None:
    # Given a message processed, whose processed row was purged since (Redis still knows)
    import sqlalchemy as sa

    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    pipeline = app.pipeline()
    assert pipeline.process(delivery("M1")).outcome is Outcome.SUCCEEDED
    assert pipeline.redis is not None and pipeline.redis.flush(5)
    with env.db.engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {env.db.names.processed}"))
    pipeline.recent = type(pipeline.recent)(0)  # (a new process: nothing in memory)
    # When it is delivered again while duplicates are rare (the claim overlaps the INSERT)
    assert pipeline.predictor.expect_new()
    again = pipeline.process(delivery("M1"))
    # Then Redis' answer rolled the new row back: a duplicate, applied once
    assert again.outcome is Outcome.DUPLICATE and env.effects() == {"A": 1}
    assert env.processed() == []
    app.close()


def test_frequent_duplicates_switch_the_pipeline_to_claiming_first() -> None:
    from consumer_kit.dedupe import Predictor

    predictor = Predictor()
    assert predictor.expect_new()
    for _ in range(10):
        predictor.saw(True)
    assert not predictor.expect_new()
    for _ in range(60):
        predictor.saw(False)
    assert predictor.expect_new()


def test_a_message_another_consumer_holds_is_deferred_without_spending_a_retry(
        env: Env) -> None:
    # Given: another consumer of the group holds the handler lease of M1 in Redis
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        if msg.id == "M2":
            raise RuntimeError("database hiccup")
        add_reservation(env, session, msg.id)

    redis = app.pipeline().redis
    assert redis is not None
    from consumer_kit.dedupe import Claim

    assert redis.claim("M1", "another-consumer") is Claim.CLAIMED
    # When: this consumer gets M1, and M2 whose handler fails
    held = app.process(delivery("M1"))
    failed = app.process(delivery("M2"))
    # Then: M1 comes back later without spending a reconsume (it was not tried); M2 spends one
    assert (held.status, held.spend) == (ConsumeStatus.RECONSUME_LATER, False)
    assert (failed.status, failed.spend) == (ConsumeStatus.RECONSUME_LATER, True)
    assert env.effects() == {}
    app.close()


def test_a_handler_that_rolls_back_its_session_is_retried_and_nothing_is_recorded(
        env: Env) -> None:
    # Given a handler that rolls its session back the first time it runs
    app = env.app()
    calls: list[int] = []

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        calls.append(1)
        if len(calls) == 1:
            session.rollback()

    # When it runs
    first = app.pipeline().process(delivery("M1"))
    # Then it is not a success: no processed row, no effect, the broker redelivers
    assert first.outcome is Outcome.RETRY and "rolled back its session" in str(first.reason)
    assert env.processed() == [] and env.effects() == {}
    # and the redelivery runs the handler again and applies it once
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert len(calls) == 2 and env.effects() == {"A": 1}
    app.close()


@pytest.mark.parametrize("claims", ["adaptive", "database only"])
def test_a_rejection_recorded_first_by_a_concurrent_delivery_leaves_the_message_able_to_run_again(
        env: Env, claims: str) -> None:
    # Given two consumers of one group without a Redis claim per message, whose handler
    # rejects a message unless an operator re-sent it
    kwargs: dict[str, Any] = ({"redis_claims": "adaptive"} if claims == "adaptive"
                              else {"use_redis": False})
    runs: list[str] = []

    def consumer() -> Any:
        app = env.app(**kwargs)

        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            runs.append(msg.id)
            if not msg.resend:
                raise Reject("unknown sku")
            add_reservation(env, session, "A")

        return app

    a, b = consumer(), consumer()
    first_a = a.pipeline()
    record_reject = first_a.handling.reject

    def b_rejects_it_first(msg: Message, reason: str, *, receipt: bool) -> Any:
        # the second delivery, at B, once A's handler rolled back and before A records it
        assert b.pipeline().process(delivery("M1")).outcome is Outcome.REJECTED
        return record_reject(msg, reason, receipt=receipt)

    first_a.handling.reject = b_rejects_it_first
    # When A's rejection finds B's FAILED row
    result = first_a.process(delivery("M1"))
    first_a.handling.reject = record_reject
    # Then A answers a duplicate that may run again: no memory of a finished id, no marker
    assert result.outcome is Outcome.DUPLICATE and result.may_run_again
    assert "M1" not in first_a.recent
    if first_a.redis is not None:
        assert first_a.redis.flush(5)
        assert not env.redis.exists(done_key(a.group, "M1"))
    # and the operator's re-send runs the handler at A and applies it once
    resend = delivery("M1")
    resend = dataclasses.replace(resend, properties={**resend.properties, "ckit_resend": "1"})
    assert first_a.process(resend).outcome is Outcome.SUCCEEDED
    assert runs == ["M1", "M1", "M1"] and env.effects() == {"A": 1}
    a.close()
    b.close()
