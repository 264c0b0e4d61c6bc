"""Control-flow exceptions a handler raises to steer the outcome (they are not failures)."""

from __future__ import annotations

import datetime as dt

from consumer_kit.core.raised import describe_exception, exception_text


class Reject(Exception):
    """Refuse a message permanently: it is recorded FAILED with `reason`, acked to the broker,
    and acked to the producer as rejected (its outbox row becomes REJECTED).

    >>> raise Reject("unknown sku")            # doctest: +SKIP
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Retry(Exception):
    """Ask for a redelivery later (RECONSUME_LATER); the broker's back-off decides when.

    `delay` is the handler's wish, recorded in the logged reason; the broker's own back-off
    decides the actual delay (RocketMQ's push consumer cannot set one per message).
    """

    def __init__(self, reason: str = "retry requested", *, delay: dt.timedelta | None = None
                 ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class InvalidBody(ValueError):
    """`Message.json()` found a body that is not valid JSON (a permanent error)."""


def reason_of(exc: Reject | Retry) -> str:
    """The reason a handler's `Reject` or `Retry` gives, as text: an exception given as the
    reason (`Reject(exc)`) as `NAME: TEXT`, anything else as its `str()`, and one whose
    `reason` is missing (a subclass whose `__init__` never called `Reject.__init__`) as the
    exception's own text. (Used as it was, a reason that is not text made every attempt a
    "pipeline error", and the message reached the broker's dead letters with no processed
    row.)

    >>> reason_of(Reject(KeyError("sku-9"))), reason_of(Retry(None))
    ("KeyError: 'sku-9'", 'None')
    """
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, str):
        return reason
    if isinstance(reason, BaseException):
        return exception_text(reason) if reason is exc else describe_exception(reason)
    try:
        return str(reason)
    except Exception:
        return exception_text(exc)
