"""The transport interface shared by both halves: send a message, consume a group's topics.

A transport is chosen by URL (see `consumer_kit.transports.open_transport`). Every backend runs the
same conformance suite (`tests/transports/test_conformance.py`).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence

from consumer_kit.errors import MessageTooLarge

#: Property names of the envelope (see DESIGN.md, "The envelope").
PROP_ID = "ckit_id"
PROP_BIZ = "ckit_biz"
PROP_SRC = "ckit_src"
PROP_SENT = "ckit_sent"
PROP_ENC = "ckit_enc"
PROP_TRACEPARENT = "traceparent"
#: Why the previous attempt failed: set by transports on retry copies and dead letters, stripped
#: from `Delivery.properties` on receive (it arrives as `Delivery.last_error`).
PROP_REASON = "ckit_reason"

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_RECONSUME_TIMES = 16
#: The RocketMQ broker's default `messageDelayLevel` in seconds (1s 5s 10s 30s 1m 2m ... 1h 2h).
DEFAULT_DELAY_LEVELS: tuple[float, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)
#: RECONSUME_LATER back-off: RocketMQ redelivers at delay level `3 + reconsumeTimes` (10s, 30s,
#: 1m, 2m, ...), so the other transports use the same levels from the third on.
DEFAULT_RETRY_DELAYS: tuple[float, ...] = DEFAULT_DELAY_LEVELS[2:]


class ConsumeStatus(enum.IntEnum):
    """What a consumer callback answers (the numbers match the RocketMQ client)."""

    CONSUME_SUCCESS = 0
    RECONSUME_LATER = 1


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
    UNIQ_KEY, stable across redeliveries of one send. `last_error` is the reason the previous
    attempt failed (empty on a first delivery, or when the callback gave none);
    `max_reconsume_times` is the group's limit when the transport knows it: this delivery is
    the last attempt when `reconsume_times >= max_reconsume_times`.
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


@dataclasses.dataclass(frozen=True)
class Subscription:
    """A topic and its tag expression (`*` or `TagA || TagB`)."""

    topic: str
    expression: str = "*"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A callback's answer with the reason of a RECONSUME_LATER (it travels with the retry
    copy and the dead letter, and comes back as `Delivery.last_error`)."""

    status: ConsumeStatus
    reason: str = ""


def as_verdict(answer: ConsumeStatus | Verdict | int) -> Verdict:
    """A callback's answer as a `Verdict` (a bare status has no reason).

    >>> as_verdict(ConsumeStatus.RECONSUME_LATER)
    Verdict(status=<ConsumeStatus.RECONSUME_LATER: 1>, reason='')

    Raises:
        ValueError: an int that is not a `ConsumeStatus`.
    """
    if isinstance(answer, Verdict):
        return answer
    return Verdict(ConsumeStatus(answer))


DeliveryCallback = Callable[[Delivery], ConsumeStatus | Verdict]


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


def check_body_size(body: bytes, limit: int) -> None:
    """Refuse a body over `limit` bytes before anything is sent.

    Raises:
        MessageTooLarge: `len(body) > limit`.
    """
    if len(body) > limit:
        raise MessageTooLarge(f"body of {len(body)} bytes exceeds the limit of {limit}")


def retry_delay(delays: Sequence[float], reconsume_times: int) -> float:
    """Seconds before redelivering a message already reconsumed `reconsume_times` times: the
    matching entry of `delays`, the last one once they run out (0 when there are none).

    >>> retry_delay((10, 30), 0), retry_delay((10, 30), 5), retry_delay((), 3)
    (10, 30, 0.0)
    """
    if not delays:
        return 0.0
    return delays[min(reconsume_times, len(delays) - 1)]


def retry_topic(group: str) -> str:
    """RocketMQ's retry topic name for a consumer group."""
    return f"%RETRY%{group}"


def dlq_topic(group: str) -> str:
    """RocketMQ's dead-letter topic name for a consumer group."""
    return f"%DLQ%{group}"


class Consumer(abc.ABC):
    """A running subscription of one group; made by `Transport.consumer`, started by `start`."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin delivering to the callback on the transport's own threads."""

    @abc.abstractmethod
    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop taking messages, let in-flight callbacks finish (up to `timeout`), release."""

    @property
    @abc.abstractmethod
    def in_flight(self) -> int:
        """Callbacks running right now."""

    def ready(self) -> int | None:
        """Messages deliverable now (not yet handed out), or None when the transport can't tell.

        `ckit consume --burst` exits when this is 0 and nothing is in flight; transports that
        return None are drained by an idle timeout instead.
        """
        return None


class Transport(abc.ABC):
    """Send messages and make consumers. Thread-safe: one instance serves a whole process."""

    #: The scheme this transport answers to (memory, sql, rocketmq).
    scheme: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @abc.abstractmethod
    def send(self, message: OutgoingMessage) -> SendResult:
        """Send synchronously; return the broker's id.

        Raises:
            MessageTooLarge: the body is over `max_body_bytes` (nothing sent).
            TransportUnavailable: the broker cannot be reached (retry later).
            TransportError: any other send failure.
        """

    @abc.abstractmethod
    def consumer(
        self,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: DeliveryCallback,
        *,
        threads: int = 1,
    ) -> Consumer:
        """Make a consumer of `group` over `subscriptions`; one callback routes every topic.

        The callback answers a `ConsumeStatus` or a `Verdict` (RECONSUME_LATER with its
        reason). It may raise: transports treat an exception as RECONSUME_LATER (the exception
        is the reason) and log it. A failure never rides on other messages: only the message
        answered RECONSUME_LATER is redelivered (on an ordered RocketMQ topic the messages
        behind it in its queue wait for it, by design).
        """

    def ensure_topic(self, topic: str) -> None:  # noqa: B027 - optional hook
        """Create the topic when the backend needs it created before use (no-op by default)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads. Idempotent."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
