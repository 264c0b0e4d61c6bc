"""Control-flow exceptions a handler raises to steer the outcome (they are not failures)."""

from __future__ import annotations

import datetime as dt


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
