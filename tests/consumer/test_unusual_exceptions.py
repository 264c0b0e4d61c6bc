"""Handler exceptions out of the ordinary: one whose `str()` raises, and a `BaseException` that
is not an `Exception` (a library's own, a gevent timeout). Each is a handler failure like any
other: retried with a reason that names it, and on the last attempt dead-lettered with its
DEAD_LETTERED processed row, counted. Only the exceptions that mean the process is stopping
(`SystemExit`, `KeyboardInterrupt`, `GeneratorExit`) pass through, the Redis lease released
(docs/signals.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from consumer_kit import ConsumerApp, Message, Outcome, Reject, Retry
from consumer_kit.core.raised import describe_exception, exception_text
from consumer_kit.core.schema import ProcessedStatus
from consumer_kit.dedupe.keys import lease_key
from consumer_kit.metrics import DEAD_LETTERED, REJECTED, RETRIED
from consumer_kit.transports import Delivery
from tests.consumer.conftest import Env, add_reservation, delivery


class Unprintable(Exception):
    """An error whose text cannot be made: its `str()` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class Unreadable(Exception):
    """An error whose `str()` and `repr()` both raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class OutOfStock(Reject):
    """A `Reject` of the handler's own whose `__init__` never calls `Reject.__init__`."""

    def __init__(self, sku: str) -> None:
        Exception.__init__(self, f"out of stock: {sku}")


class Abort(BaseException):
    """A library's own `BaseException`: not an `Exception`, not a stop of the process."""


def last(ckit_id: str, attempts: int = 1) -> Delivery:
    """The delivery of `ckit_id` that is its last attempt, after `attempts - 1` others."""
    return dataclasses.replace(delivery(ckit_id, reconsume=attempts - 1),
                               max_reconsume_times=attempts - 1)


def counted(app: ConsumerApp, metric: Any) -> float:
    """`metric`'s count for the app's group on the test topic."""
    return float(metric.labels(app.group, "ORDER_CREATED")._value.get())


def failing_app(env: Env, error: BaseException, *, session: bool) -> ConsumerApp:
    """An app whose one listener writes a reservation (with a session) then raises `error`."""
    app = env.app()
    if session:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(env, session, "A")
            raise error
    else:
        @app.listener("ORDER_CREATED")
        def notify(msg: Message) -> None:
            raise error
    return app


@pytest.mark.parametrize("session", [True, False], ids=["session", "no-session"])
@pytest.mark.parametrize(("error", "named"), [
    (Unprintable(), "Unprintable: Unprintable() (its str() raised RuntimeError)"),
    (Unreadable(), "Unreadable: <unprintable Unreadable object>"),
    (Abort("the warehouse hung up"), "Abort: the warehouse hung up"),
], ids=["str-raises", "str-and-repr-raise", "base-exception"])
def test_an_unusual_handler_error_is_retried_then_dead_lettered_with_its_row_and_count(
        env: Env, error: BaseException, named: str, session: bool) -> None:
    # Given a handler that raises an error whose str() raises, or a BaseException subclass
    app = failing_app(env, error, session=session)
    pipe = app.pipeline()
    retried, dead = counted(app, RETRIED), counted(app, DEAD_LETTERED)

    # When the message is delivered, then delivered for its last attempt
    first = pipe.process(dataclasses.replace(delivery("M1"), max_reconsume_times=1))
    rows_after_first = env.processed()
    final = pipe.process(last("M1", attempts=2))
    app.close()

    # Then the first is retried with a reason naming the handler's error, nothing recorded
    assert first.outcome is Outcome.RETRY and first.reason == named
    assert rows_after_first == []
    # and the last is dead-lettered: its DEAD_LETTERED row says why, in the same words
    assert final.outcome is Outcome.DEAD_LETTER
    assert final.reason == f"retries spent after 2 deliveries: {named}"
    assert env.processed() == [("M1", ProcessedStatus.DEAD_LETTERED.value, final.reason)]
    assert env.effects() == {}  # the handler's writes were rolled back
    # and both outcomes were counted, in the pipeline's counts and its metrics
    assert pipe.counts == {Outcome.RETRY: 1, Outcome.DEAD_LETTER: 1}
    assert counted(app, RETRIED) == retried + 1
    assert counted(app, DEAD_LETTERED) == dead + 1
    # and the Redis lease was released each time, never left to expire
    assert not env.redis.exists(lease_key(app.group, "M1"))


def test_a_base_exception_listed_as_permanent_rejects_the_message(env: Env) -> None:
    # Given a listener that lists a BaseException subclass among its permanent errors
    app = env.app()

    @app.listener("ORDER_CREATED", permanent=(Abort,))
    def reserve(msg: Message, session: Any) -> None:
        raise Abort("malformed order")

    # When its handler raises it
    result = app.pipeline().process(delivery("M1"))
    app.close()

    # Then the message is rejected, recorded FAILED with the error's name and text
    assert result.outcome is Outcome.REJECTED and result.reason == "Abort: malformed order"
    assert env.processed() == [("M1", ProcessedStatus.FAILED.value, "Abort: malformed order")]


@pytest.mark.parametrize("session", [True, False], ids=["session", "no-session"])
@pytest.mark.parametrize(("reason", "named"), [
    (KeyError("sku-9"), "KeyError: 'sku-9'"),
    (404, "404"),
    (None, "None"),
], ids=["an-exception", "an-int", "none"])
@pytest.mark.parametrize("made", [Reject, None], ids=["reject", "subclass-without-reason"])
def test_a_reject_given_a_reason_that_is_not_text_rejects_the_message_with_it_as_text(
        env: Env, reason: Any, named: str, session: bool, made: Any) -> None:
    # Given a handler that wraps what went wrong in Reject, not as text (`Reject(exc)`), or
    # raises a Reject of its own that has no `reason` (its text is the reason then)
    if made is None:
        reason, named = "sku-9", "out of stock: sku-9"
    app = failing_app(env, Reject(reason) if made else OutOfStock(reason), session=session)

    # When the message is delivered
    result = app.pipeline().process(delivery("M1"))
    app.close()

    # Then it is rejected and recorded FAILED with that reason as text (it was retried as a
    # "pipeline error" every time, then dead-lettered by the broker with no processed row)
    assert result.outcome is Outcome.REJECTED and result.reason == named
    assert env.processed() == [("M1", ProcessedStatus.FAILED.value, named)]
    assert env.effects() == {}


@pytest.mark.parametrize(("reason", "named"), [
    (TimeoutError("stock service"), "TimeoutError: stock service"),
    (None, "None"),
], ids=["an-exception", "none"])
def test_a_retry_given_a_reason_that_is_not_text_is_retried_then_dead_lettered_with_it(
        env: Env, reason: Any, named: str) -> None:
    # Given a handler that asks for a retry with a reason that is not text
    app = failing_app(env, Retry(reason), session=True)
    pipe = app.pipeline()

    # When the message is delivered, then delivered for its last attempt
    first = pipe.process(dataclasses.replace(delivery("M1"), max_reconsume_times=1))
    final = pipe.process(last("M1", attempts=2))
    app.close()

    # Then it is retried with that reason as text, and its last attempt is dead-lettered with
    # its row (a "pipeline error" left the broker's dead letter without one)
    assert first.outcome is Outcome.RETRY and first.reason == named
    assert final.outcome is Outcome.DEAD_LETTER
    assert env.processed() == [("M1", ProcessedStatus.DEAD_LETTERED.value,
                                f"retries spent after 2 deliveries: {named}")]


@pytest.mark.parametrize(("error", "named"), [
    (Unprintable(), "Unprintable: Unprintable() (its str() raised RuntimeError)"),
    (Abort("no key today"), "Abort: no key today"),
], ids=["str-raises", "base-exception"])
def test_a_dedupe_key_function_raising_an_unusual_error_rejects_the_message_naming_it(
        env: Env, error: BaseException, named: str) -> None:
    # Given a listener whose dedupe_key function raises (for a message without an outbox id)
    app = env.app()
    ran: list[str] = []

    def key(msg: Message) -> str:
        raise error

    @app.listener("ORDER_CREATED", dedupe_key=key)
    def reserve(msg: Message, session: Any) -> None:
        ran.append(msg.id)

    rejected = counted(app, REJECTED)

    # When such a message is delivered
    result = app.pipeline().process(delivery(None, keys="K1", src=None))
    counts = app.pipeline().counts
    app.close()

    # Then it is rejected as when the function raises an Exception, the reason naming the error
    reason = f"dedupe_key failed: {named}"
    assert result.outcome is Outcome.REJECTED and result.reason == reason
    assert [(status, error_text) for _id, status, error_text in env.processed()] == [
        (ProcessedStatus.FAILED.value, reason)]
    assert counts == {Outcome.REJECTED: 1}
    assert counted(app, REJECTED) == rejected + 1
    assert ran == []


@pytest.mark.parametrize("stop", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_an_exception_that_stops_the_process_passes_through_and_frees_the_lease(
        env: Env, stop: type[BaseException]) -> None:
    # Given a handler that raises an exception meaning the process is stopping
    app = failing_app(env, stop(), session=True)

    # When the message is delivered for its last attempt
    with pytest.raises(stop):
        app.pipeline().process(last("M1"))
    counts = app.pipeline().counts
    app.close()

    # Then it is raised on, nothing recorded or counted, and the Redis lease is released (the
    # redelivery after the restart runs at once)
    assert env.processed() == [] and env.effects() == {}
    assert counts == {}
    assert not env.redis.exists(lease_key(app.group, "M1"))


@pytest.mark.parametrize("stop", [SystemExit, KeyboardInterrupt])
def test_a_dedupe_key_function_that_stops_the_process_passes_through(
        env: Env, stop: type[BaseException]) -> None:
    # Given a listener whose dedupe_key function raises an exception that stops the process
    app = env.app()

    def key(msg: Message) -> str:
        raise stop()

    @app.listener("ORDER_CREATED", dedupe_key=key)
    def reserve(msg: Message, session: Any) -> None:
        pass

    # When a message without an outbox id is delivered
    # Then it is raised on, nothing recorded
    with pytest.raises(stop):
        app.pipeline().process(delivery(None, keys="K1", src=None))
    app.close()
    assert env.processed() == []


def test_the_text_of_an_exception_whose_str_and_repr_raise_is_made_without_raising() -> None:
    # Given errors whose str() raises, and whose str() and repr() both raise
    # When their text is made
    # Then it falls back to their repr, then to a placeholder naming the type
    assert exception_text(Unprintable()) == "Unprintable() (its str() raised RuntimeError)"
    assert exception_text(Unreadable()) == "<unprintable Unreadable object>"
    assert describe_exception(ValueError("bad")) == "ValueError: bad"  # the usual words


def test_the_text_of_an_exception_whose_str_stops_the_process_raises_that() -> None:
    # Given an error whose str() is interrupted (Ctrl-C lands in it)
    class Interrupted(Exception):
        def __str__(self) -> str:
            raise KeyboardInterrupt

    # When its text is made
    # Then the interrupt is raised on, not swallowed into a fallback
    with pytest.raises(KeyboardInterrupt):
        exception_text(Interrupted())
