"""Handler errors, rejects, bad input: redelivery or a stored reason, never a lost message."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit import Message, Outcome, Reject, Retry
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

    assert app.pipeline().process(delivery("M1", b'{"sku": "A"}')).outcome is Outcome.REJECTED
    assert env.processed() == [("M1", "FAILED", "dedupe_key failed: KeyError: 'order'")]


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
