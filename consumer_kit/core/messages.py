"""The message values every layer shares: what is sent, what is delivered, what a consumer
callback answers. Plain data, no I/O: transports (`consumer_kit.transports`) move them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence


class ConsumeStatus(enum.IntEnum):
    """The broker ack: what a consumer callback answers (numbers match the RocketMQ client)."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A callback's answer with the reason of a RECONSUME_LATER: transports carry the reason
    with the redelivery (`Delivery.last_error`) and into the dead letter.

    `spend` False marks a RECONSUME_LATER that did not try the message (another consumer holds
    it: the handler lease): transports redeliver it after the usual back-off without counting a
    reconsume, so such answers can never push a message into the dead letters.

    >>> Verdict(ConsumeStatus.RECONSUME_LATER, "db down").status.name
    'RECONSUME_LATER'
    """

    status: ConsumeStatus
    reason: str = ""
    spend: bool = True


def as_verdict(answer: ConsumeStatus | Verdict | int) -> Verdict:
    """Normalise a callback's answer (a `ConsumeStatus`, its int, or a `Verdict`).

    Raises:
        ValueError: an int that is no `ConsumeStatus`.
    """
    if isinstance(answer, Verdict):  # its status may be a bare int: every check uses `is`
        if type(answer.status) is ConsumeStatus:
            return answer
        return dataclasses.replace(answer, status=ConsumeStatus(int(answer.status)))
    return Verdict(ConsumeStatus(int(answer)))


@dataclasses.dataclass(frozen=True)
class OutgoingMessage:
    """A message to send. `delay` is in seconds; `keys` become the RocketMQ KEYS."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    delay: float | None = None
    sharding_key: str | None = None


@dataclasses.dataclass(frozen=True)
class SendResult:
    """The broker's answer to a successful send."""

    broker_message_id: str
    queue_id: int | None = None
    queue_offset: int | None = None


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A received message, copied out of the transport's own object (safe to keep).

    `keys` is the RocketMQ KEYS string (space separated); `broker_message_id` is the broker's
    UNIQ_KEY, stable across redeliveries of one send. `last_error` is why the previous attempt
    failed ("" on a first delivery); `max_reconsume_times` is the group's limit when the
    transport knows it: the delivery is the last attempt when `reconsume_times` reaches it.
    """

    topic: str
    body: bytes
    broker_message_id: str
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    reconsume_times: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    born_timestamp_ms: int = 0
    last_error: str = ""
    max_reconsume_times: int | None = None
    #: False when the transport lost the order of several KEYS (a RocketMQ 5 client whose
    #: received keys are a set): `core.envelope.dedupe_id` then uses them all, never one
    #: picked by that lost order
    keys_in_order: bool = True

    @property
    def last_attempt(self) -> bool:
        """True when a RECONSUME_LATER now sends the message to the dead letters."""
        limit = self.max_reconsume_times
        return limit is not None and self.reconsume_times >= limit


@dataclasses.dataclass(frozen=True)
class Subscription:
    """A topic and its tag expression (`*` or `TagA || TagB`)."""

    topic: str
    expression: str = "*"


DeliveryCallback = Callable[[Delivery], "ConsumeStatus | Verdict"]


def tag_matches(expression: str, tags: str | None) -> bool:
    """RocketMQ tag filtering: `*` (or empty) matches all, else one of the `||`-separated tags.

    >>> tag_matches("A || B", "B"), tag_matches("A", None)
    (True, False)
    """
    expr = (expression or "*").strip()
    if expr == "*":
        return True
    wanted = {part.strip() for part in expr.split("||") if part.strip()}
    return (tags or "") in wanted


def merge_expressions(subscriptions: Sequence[Subscription]) -> dict[str, str]:
    """One tag expression per topic for subscriptions that may name a topic twice: `*` wins,
    else the expressions are joined with `||`.

    >>> merge_expressions([Subscription("T", "a"), Subscription("T", "b"), Subscription("U")])
    {'T': 'a || b', 'U': '*'}
    """
    merged: dict[str, str] = {}
    for sub in subscriptions:
        old, expr = merged.get(sub.topic), (sub.expression or "*").strip()
        merged[sub.topic] = "*" if "*" in (old, expr) else (
            expr if old is None else f"{old} || {expr}")
    return merged


def retry_topic(group: str) -> str:
    """RocketMQ's retry topic name for a consumer group."""
    return f"%RETRY%{group}"


def dlq_topic(group: str) -> str:
    """RocketMQ's dead-letter topic name for a consumer group."""
    return f"%DLQ%{group}"
