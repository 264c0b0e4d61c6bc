"""The transport interface shared by both halves: send a message, consume a group's topics,
read a group's dead letters.

A transport is chosen by URL (`consumer_kit.transports.open_transport`). Every backend passes the
conformance suite shipped in `consumer_kit.testing`. The message values it moves live in
`consumer_kit.core.messages`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from consumer_kit.core.envelope import stored_text
from consumer_kit.core.errors import ConfigError, MessageTooLarge
from consumer_kit.core.messages import (
    Delivery,
    DeliveryCallback,
    OutgoingMessage,
    SendResult,
    Subscription,
)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_RECONSUME_TIMES = 16
#: The RocketMQ broker's default `messageDelayLevel` in seconds (1s 5s 10s 30s 1m 2m ... 1h 2h).
DEFAULT_DELAY_LEVELS: tuple[float, ...] = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)
#: RECONSUME_LATER back-off: RocketMQ redelivers at delay level `3 + reconsumeTimes` (10s, 30s,
#: 1m, 2m, ...), so the other transports use the same levels from the third on.
DEFAULT_RETRY_DELAYS: tuple[float, ...] = DEFAULT_DELAY_LEVELS[2:]
#: Longest reason a transport carries with a retry or a dead letter.
REASON_MAX_CHARS = 1000


def check_body_size(body: bytes, limit: int) -> None:
    """Refuse a body over `limit` bytes before anything is sent.

    Raises:
        MessageTooLarge: `len(body) > limit`.
    """
    if len(body) > limit:
        raise MessageTooLarge(f"body of {len(body)} bytes exceeds the limit of {limit}")


def all_ordered(group: str, subscriptions: Sequence[Subscription],
                ordered_topics: frozenset[str] | set[str]) -> bool:
    """Whether one consumer of `group` is ordered: all its topics are ordered, or none is.

    Raises:
        ConfigError: some topics are ordered and others not (an ordered consumer would hold the
            others back, a concurrent one would break the order of the ordered ones).
    """
    ordered = sorted({s.topic for s in subscriptions if s.topic in ordered_topics})
    plain = sorted({s.topic for s in subscriptions if s.topic not in ordered_topics})
    if ordered and plain:
        raise ConfigError(f"consumer group {group} mixes ordered topics ({', '.join(ordered)}) "
                          f"with unordered ones ({', '.join(plain)}): one consumer is either "
                          "ordered or concurrent; consume them in two groups")
    return bool(ordered)


def retry_delay(delays: Sequence[float], reconsume_times: int) -> float:
    """Seconds before redelivering a message already reconsumed `reconsume_times` times: the
    matching entry of `delays`, the last one once they run out (0 when there are none).

    >>> retry_delay((10, 30), 0), retry_delay((10, 30), 5), retry_delay((), 3)
    (10, 30, 0.0)
    """
    if not delays:
        return 0.0
    return delays[min(reconsume_times, len(delays) - 1)]


def clip_reason(reason: str) -> str:
    """A reason fit to travel: one line of at most `REASON_MAX_CHARS` characters, without the
    control characters RocketMQ properties cannot carry, a lone surrogate as U+FFFD (a
    handler's error quoting text decoded with `surrogateescape`: no encoding carries it, and
    the SQL transport's dead-letter insert raised, killing its worker thread).

    >>> clip_reason("bad\\x00 name \\udce9") == "bad name \\ufffd"
    True
    """
    text = " ".join(stored_text(reason).split())
    text = "".join(ch for ch in text if ch >= " ")
    return text if len(text) <= REASON_MAX_CHARS else text[:REASON_MAX_CHARS - 3] + "..."


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
        """Messages not handed out yet, or None when the transport can't tell: those
        deliverable now and this group's redeliveries still waiting for their time.

        `ckit consume --burst` exits when this is 0 and nothing is in flight (a burst run waits
        for its own redeliveries; a message another producer delayed is not waited for);
        transports that return None are drained by an idle timeout instead.
        """
        return None

    @property
    def failure(self) -> str | None:
        """Why this consumer cannot go on (it stalled and rebuilding it did not help), or None.
        The runner stops it and raises `ConsumerStalled` so that the process exits non-zero."""
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

        The callback may raise: transports treat an exception as RECONSUME_LATER and log it.
        """

    @abc.abstractmethod
    def dead_letters(self, group: str) -> list[Delivery]:
        """Messages of `group` whose retries are spent (RocketMQ's `%DLQ%group`), oldest first,
        read without consuming them; `last_error` holds the reason of the last attempt."""

    #: False for transports that only reach consumers in the same process (memory://)
    shared_across_processes: bool = True

    def check(self) -> None:  # noqa: B027 - optional hook
        """Fail fast on a misconfiguration before any message moves (tables missing, client
        library missing). An unreachable broker is an outage, not a misconfiguration: it is
        not reported here.

        Raises:
            ConfigError, SchemaError: what is wrong and how to fix it.
        """

    def ensure_topic(self, topic: str) -> None:  # noqa: B027 - optional hook
        """Create the topic when the backend needs it created before use (no-op by default)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads. Idempotent."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
