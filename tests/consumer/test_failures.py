"""Handler errors, rejects, bad input: redelivery or a stored reason, never a lost message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from consumer_kit import Message, Outcome, Reject, Retry
from consumer_kit.core.schema import ProcessedStatus
from consumer_kit.dedupe.keys import lease_key
from consumer_kit.transports import ConsumeStatus, Delivery
from tests.consumer.conftest import Env, add_reservation, delivery


def test_a_handler_error_rolls_back_its_writes_and_asks_for_redelivery(env: Env) -> None:
    app = env.app()
    calls: list[int] = []

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        calls.append(msg.reconsume_times)
        add_reservation(env, session, "A")
        if len(calls) == 1:
            raise RuntimeError("warehouse API timeout")

    assert app.process(delivery("M1")).status is ConsumeStatus.RECONSUME_LATER
    assert env.effects() == {}
    assert env.processed() == []
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}


def test_retry_asks_for_redelivery_and_records_nothing(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        raise Retry("stock service busy")

    result = app.pipeline().process(delivery("M1"))
    assert (result.outcome, result.reason) == (Outcome.RETRY, "stock service busy")
    assert env.processed() == []


def test_a_retry_delay_is_kept_in_the_logged_reason(env: Env) -> None:
    import datetime as dt

    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message) -> None:
        raise Retry("stock service busy", delay=dt.timedelta(seconds=30))

    result = app.pipeline().process(delivery("M1"))
    assert result.reason == "stock service busy (asked for a delay of 0:00:30)"


def test_reject_stores_the_reason_and_acks_the_broker(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        raise Reject("sku A is discontinued")

    assert app.process(delivery("M1")).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.processed() == [("M1", "FAILED", "sku A is discontinued")]
    assert env.effects() == {}  # the business write was rolled back
    assert app.pipeline().process(delivery("M1")).outcome is Outcome.DUPLICATE


def test_a_body_that_is_not_json_is_rejected_with_the_parse_error(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        msg.json()

    assert app.process(delivery("M1", b"{not json")).status is ConsumeStatus.CONSUME_SUCCESS
    [(_mid, status, error)] = env.processed()
    assert status == "FAILED"
    assert error is not None and error.startswith("InvalidBody: body is not valid JSON")


def test_configured_permanent_errors_reject_instead_of_retrying(env: Env) -> None:
    class ValidationError(Exception):
        pass

    app = env.app(permanent_errors=(ValidationError,))

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message) -> None:
        raise ValidationError("quantity must be positive")

    assert app.pipeline().process(delivery("M1")).outcome is Outcome.REJECTED
    assert env.processed()[0][2] == "ValidationError: quantity must be positive"


def test_a_message_for_a_topic_without_listener_is_rejected_with_the_reason(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED", tags="created")
    def reserve(msg: Message) -> None:
        pass

    result = app.pipeline().process(delivery("M1", tags="cancelled"))
    assert result.outcome is Outcome.REJECTED
    assert "no listener for topic 'ORDER_CREATED' with tags 'cancelled'" in str(
        env.processed()[0][2])


def test_nothing_escapes_the_callback_not_even_base_exceptions(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message) -> None:
        raise SystemExit("handler called exit")

    assert app.process(delivery("M1")).status is ConsumeStatus.RECONSUME_LATER
    assert env.processed() == []
    # and the Redis lease was released: a redelivery is processed at once, not answered busy
    assert not env.redis.exists(lease_key(app.group, "M1"))


def test_the_consumer_database_down_means_redelivery_never_an_ack(env: Env) -> None:
    app = env.app()
    app.db = "mysql+pymysql://app:SECRET@127.0.0.1:1/none"  # unreachable

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    assert app.process(delivery("M1")).status is ConsumeStatus.RECONSUME_LATER
    # and the Redis lease was released, not marked done: the redelivery can run
    redis_store = app.pipeline().redis
    assert redis_store is not None and redis_store.flush()
    assert env.redis.keys(f"ckit:{{{app.group}}}:lease:*") == []
    assert env.redis.keys(f"ckit:{{{app.group}}}:done:*") == []


def test_a_handler_without_session_records_after_it_returns(env: Env) -> None:
    app = env.app()
    seen: list[str] = []

    @app.listener("ORDER_CREATED")
    def notify(msg: Message) -> None:
        seen.append(msg.id)

    app.process(delivery("M1"))
    app.process(delivery("M1"))
    assert seen == ["M1"]
    assert env.processed() == [("M1", "SUCCEEDED", None)]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"ckit_id": None, "keys": "order-9 extra", "broker_id": "BROKER1"}, "order-9"),
    ({"ckit_id": None, "keys": "", "broker_id": "BROKER2"}, "BROKER2"),
    ({"ckit_id": "CK1", "keys": "order-9", "broker_id": "BROKER3"}, "CK1"),
])
def test_the_dedupe_key_is_ckit_id_then_keys_then_the_broker_id(
    env: Env, kwargs: dict[str, Any], expected: str
) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    app.process(delivery(src=None, **kwargs))
    app.process(delivery(src=None, **kwargs))
    assert [m for m, _, _ in env.processed()] == [expected]
    assert env.effects() == {"A": 1}


def test_a_listener_may_bring_its_own_dedupe_key(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: "order:" + str(m.json()["order"]))
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    app.process(delivery(None, b'{"order": 5}', broker_id="X1", src=None))
    app.process(delivery(None, b'{"order": 5}', broker_id="X2", src=None))  # a producer retry
    assert [m for m, _, _ in env.processed()] == ["order:5"]
    assert env.effects() == {"A": 1}


def test_a_handler_without_session_is_not_run_again_for_a_recorded_message(env: Env) -> None:
    # Given no Redis and no in-process memory: only the processed table can tell
    app = env.app(use_redis=False, local_cache=0)
    seen: list[str] = []

    @app.listener("ORDER_CREATED")
    def notify(msg: Message) -> None:
        seen.append(msg.id)

    app.process(delivery("M1"))
    app.process(delivery("M1"))
    assert seen == ["M1"]


def test_a_listeners_own_permanent_errors_reject_only_for_that_listener(env: Env) -> None:
    class OutOfStock(Exception):
        pass

    app = env.app()

    @app.listener("ORDER_CREATED", permanent=(OutOfStock,))
    def reserve(msg: Message) -> None:
        raise OutOfStock("SKU-1")

    @app.listener("ORDER_CANCELLED")
    def release(msg: Message) -> None:
        raise OutOfStock("SKU-2")

    assert app.pipeline().process(delivery("M1")).outcome is Outcome.REJECTED
    assert app.pipeline().process(delivery("M2", topic="ORDER_CANCELLED")).outcome is (
        Outcome.RETRY)
    assert env.processed() == [("M1", "FAILED", "OutOfStock: SKU-1")]


def test_a_failing_dedupe_key_function_rejects_with_the_reason(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: m.json()["order"])
    def reserve(msg: Message) -> None:
        pass

    message = delivery(None, b'{"sku": "A"}', keys="M1", src=None)  # a foreign message
    assert app.pipeline().process(message).outcome is Outcome.REJECTED
    assert env.processed() == [("M1", "FAILED", "dedupe_key failed: KeyError: 'order'")]


@pytest.mark.parametrize("returned", [None, "", b"order-1", 1.5, True])
def test_a_dedupe_key_that_returns_no_usable_id_rejects_instead_of_merging_messages(
        env: Env, returned: Any) -> None:
    # Given a dedupe_key that finds nothing in these messages (str(None) made them all "None")
    app = env.app()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: returned)
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.json()["sku"])

    # When two different foreign messages arrive
    first = app.pipeline().process(delivery(None, b'{"sku": "A"}', keys="K1", src=None))
    second = app.pipeline().process(delivery(None, b'{"sku": "B"}', keys="K2", src=None))
    # Then neither is taken for the other's duplicate: each is refused, recorded with why
    assert (first.outcome, second.outcome) == (Outcome.REJECTED, Outcome.REJECTED)
    assert env.effects() == {}
    reason = (f"dedupe_key returned {returned!r}: it must return a non-empty str (or an int)")
    assert env.processed() == [("K1", "FAILED", reason), ("K2", "FAILED", reason)]


def test_a_dedupe_key_that_returns_an_int_dedupes_on_its_text(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: m.json()["order"])
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    app.process(delivery(None, b'{"order": 7}', broker_id="X1", src=None))
    app.process(delivery(None, b'{"order": 7}', broker_id="X2", src=None))
    assert [m for m, _, _ in env.processed()] == ["7"]
    assert env.effects() == {"A": 1}


def _keyed_by_order(env: Env) -> tuple[Any, list[Any]]:
    """An app whose listener dedupes on `order:<order>` from the body; the receipts it sends
    at once are collected in the list."""
    sent: list[Any] = []
    app = env.app()
    app.pipeline().receipts = type("Receipts", (), {"put": lambda self, *a: sent.append(a)})()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: "order:" + str(m.json()["order"]))
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    return app, sent


def test_an_outbox_message_keeps_its_ckit_id_and_its_receipt_under_a_listeners_dedupe_key(
        env: Env) -> None:
    # Given a listener with its own dedupe_key, for the foreign messages of its topic
    app, sent = _keyed_by_order(env)

    # When an outbox message arrives
    result = app.pipeline().process(delivery("01HOUTBOXID", b'{"order": 42}'))
    # Then it dedupes on its ckit_id, and its receipt names the producer's row
    assert result.outcome is Outcome.SUCCEEDED
    assert [m for m, _, _ in env.processed()] == ["01HOUTBOXID"]
    assert [receipt.message_id for _, receipt in sent] == ["01HOUTBOXID"]


@pytest.mark.parametrize("again", ["resend", "redelivery"])
def test_an_outbox_message_processed_under_a_listeners_dedupe_key_before_is_not_run_again(
        env: Env, again: str) -> None:
    # Given a message consumer-kit processed before its listener's dedupe_key stopped applying
    # to outbox messages: its processed row is under that key, its producer got no receipt
    app, sent = _keyed_by_order(env)

    old = Message.from_delivery(delivery("01HOUTBOXID", b'{"order": 42}')).with_id("order:42")
    assert app.pipeline().store.record(old, ProcessedStatus.SUCCEEDED)
    # When the reconciler re-sends it, or the broker delivers it again
    message = delivery("01HOUTBOXID", b'{"order": 42}', reconsume=int(again == "redelivery"))
    if again == "resend":
        message = dataclasses.replace(message, properties={**message.properties,
                                                           "ckit_resend": "1"})
    result = app.pipeline().process(message)
    # Then it is a duplicate, recorded under its ckit_id, and its producer gets its receipt
    assert result.outcome is Outcome.DUPLICATE
    assert env.effects() == {}
    assert [m for m, _, _ in env.processed()] == ["01HOUTBOXID", "order:42"]
    assert app.pipeline().store.owed() == 1  # the durable receipt, under the ckit_id
    assert [receipt.message_id for _, receipt in sent] == (
        ["01HOUTBOXID"] if again == "resend" else [])  # a re-send is answered at once too


def test_two_long_foreign_ids_that_share_their_start_stay_two_messages(env: Env) -> None:
    # Given KEYS longer than the processed table's message_id (128), the same up to the end
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.json()["sku"])

    long_key = "order-created:" + "x" * 120
    for suffix, sku in (("-0", "A"), ("-1", "B"), ("-0", "A")):  # the last: a redelivery
        app.process(delivery(None, b'{"sku": "%s"}' % sku.encode(), keys=long_key + suffix,
                             src=None))
    # Then each applied once, under ids that fit the column and differ
    assert env.effects() == {"A": 1, "B": 1}
    ids = [m for m, _, _ in env.processed()]
    assert len(ids) == 2 and all(len(i) == 128 for i in ids) and ids[0] != ids[1]


def test_keys_shared_by_two_topics_are_two_messages_with_the_topic_in_the_dedupe_key(
        env: Env) -> None:
    # Given a Java producer that puts the order id in KEYS on two topics one group consumes
    app = env.app()
    by_topic = {"dedupe_key": lambda m: f"{m.topic}:{m.id}"}  # the README's recipe

    @app.listener("ORDER_CREATED", **by_topic)
    def created(msg: Message, session: Any) -> None:
        add_reservation(env, session, "created")

    @app.listener("ORDER_PAID", **by_topic)
    def paid(msg: Message, session: Any) -> None:
        add_reservation(env, session, "paid")

    for topic in ("ORDER_CREATED", "ORDER_PAID", "ORDER_PAID"):  # the last: a redelivery
        app.process(delivery(None, keys="ORDER-123", topic=topic, src=None))
    assert env.effects() == {"created": 1, "paid": 1}
    assert [m for m, _, _ in env.processed()] == ["ORDER_CREATED:ORDER-123",
                                                  "ORDER_PAID:ORDER-123"]


@pytest.mark.parametrize("session", [True, False])
def test_a_handler_returning_reconsume_later_is_retried_not_acked(env: Env, session: bool) -> None:
    app = env.app()
    if session:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> ConsumeStatus:
            add_reservation(env, session, "A")
            return ConsumeStatus.RECONSUME_LATER
    else:
        @app.listener("ORDER_CREATED")
        def notify(msg: Message) -> ConsumeStatus:
            return ConsumeStatus.RECONSUME_LATER

    result = app.pipeline().process(delivery("M1"))
    assert result.outcome is Outcome.RETRY
    assert "returned RECONSUME_LATER" in (result.reason or "")
    assert env.effects() == {}
    assert env.processed() == []


def test_a_value_a_handler_returns_is_ignored_with_one_warning(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> bool:
        add_reservation(env, session, "A")
        return True

    with caplog.at_level("WARNING", logger="consumer_kit.handling"):
        for ckit_id in ("M1", "M2"):
            assert app.pipeline().process(delivery(ckit_id)).outcome is Outcome.SUCCEEDED
    warned = [r for r in caplog.records if "return value is ignored" in r.getMessage()]
    assert len(warned) == 1 and "returned True" in warned[0].getMessage()
    assert env.effects() == {"A": 2}


def test_a_message_without_any_id_is_rejected_and_recorded_under_a_body_hash(env: Env) -> None:
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message) -> None:
        raise AssertionError("must not run")

    no_id = Delivery(topic="ORDER_CREATED", body=b'{"sku": "A"}', broker_message_id="",
                     properties={})
    result = app.pipeline().process(no_id)
    assert result.outcome is Outcome.REJECTED
    [(message_id, status, reason)] = env.processed()
    assert message_id.startswith("noid-") and status == "FAILED"
    assert reason == "message has no id (no ckit_id, KEYS or broker id)"
