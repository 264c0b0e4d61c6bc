"""Sending a failed message back ourselves, so that a failure never rides on its neighbours.

Why: the native client behind rocketmq-client-python 2.0.0 hands the C callback wrapper a whole
pulled batch; the wrapper stops at the first RECONSUME_LATER and answers it for the batch, and
the client then sends *every* message of the batch back (CONSUMER_SEND_MSG_BACK, reconsume count
+1), handled or not. A healthy message pulled with a poison one spends its retries unhandled
and reaches `%DLQ%group`. (This librocketmq build also only logs a failed send-back and commits
the offset: a lost message.) So the consumer never answers RECONSUME_LATER itself; for each
message that failed it:

1. reads the stored message by its commit log offset (VIEW_MESSAGE_BY_ID) from each master
   broker and keeps the one whose topic (or `%RETRY%group`), queue, queue offset and id match
   the delivery: that gives every property, also those of foreign producers that the 2.0.0
   API cannot list;
2. stores a copy on that broker in `%RETRY%group` (SEND_MESSAGE) with reconsume count + 1, the
   delay level `3 + reconsumeTimes` capped at the broker's last level (what the broker's own
   send-back does), `RETRY_TOPIC` and `ORIGIN_MESSAGE_ID` set as the broker sets them, the same
   UNIQ_KEY (so the dedupe id stays stable; a message without one gets the id the consumer saw)
   and `ckit_reason`; or, once the count has reached the group's `retryMaxTimes` (read from that
   broker, cached), the same copy without a delay, which the broker stores in `%DLQ%group`;
3. answers CONSUME_SUCCESS for it, so the rest of the batch is handled normally.

The DLQ decision is ours, told to the broker through the send's `maxReconsumeTimes`: the broker
moves a `%RETRY%` send to the DLQ when the *new* count reaches it, while its own send-back
compares the *old* count, so the retry sends carry `retryMaxTimes + 1`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from consumer_kit.core.envelope import PROP_REASON
from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import Delivery, dlq_topic, retry_topic
from consumer_kit.transports.base import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_MAX_RECONSUME_TIMES,
    clip_reason,
)
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from consumer_kit.transports.rocketmq.codec import SYSFLAG_COMPRESSED, StoredMessage

log = logging.getLogger("consumer_kit.transports.rocketmq")

#: RECONSUME_LATER redelivers at delay level `3 + reconsumeTimes` (10 s, 30 s, 1 min ... on a
#: broker with the default levels).
FIRST_RETRY_LEVEL = 3
#: Seconds the broker's group settings and master list are trusted before they are read again.
DEFAULT_CACHE_SECONDS = 30.0
#: Seconds a send-back keeps retrying an unreachable or busy broker before the consumer falls
#: back to RECONSUME_LATER.
DEFAULT_PATIENCE = 5.0
#: The producer group the broker records for the copies (the Java consumer's own send-back
#: fallback uses this name too).
INNER_PRODUCER = "CLIENT_INNER_PRODUCER"
#: Properties the broker (or its delay schedule) sets anew on every stored copy, or that must not
#: travel on one (a transaction flag would make the copy a half message).
REWRITTEN = frozenset({
    "DELAY", "REAL_TOPIC", "REAL_QID", "CLUSTER", "WAIT", "TRAN_MSG", "PGROUP", "MIN_OFFSET",
    "MAX_OFFSET", "CONSUME_START_TIME", "MAX_RECONSUME_TIMES", "RECONSUME_TIME", PROP_REASON,
})


@dataclasses.dataclass(frozen=True)
class Copy:
    """What `plan_copy` decided: the properties of the copy and where the broker puts it."""

    properties: dict[str, str]
    reconsume_times: int
    max_reconsume_times: int
    delay_level: int  # 0 for a dead letter
    dead: bool


@dataclasses.dataclass(frozen=True)
class SentBack:
    """Where a failed message went."""

    topic: str  # %RETRY%group or %DLQ%group
    broker: str
    reconsume_times: int  # of the copy
    delay_level: int


def plan_copy(stored: StoredMessage, delivery: Delivery, *, limit: int, levels: int,
              reason: str, spend: bool = True, dead: bool = False) -> Copy:
    """The retry copy (or dead letter) of `stored`, which failed with `reason`. With `spend`
    False (a busy answer: the message was not tried) the copy keeps the reconsume count and is
    never a dead letter; with `dead` it is one whatever its count (it can never succeed).

    >>> s = StoredMessage("T", b"{}", {"UNIQ_KEY": "U1", "x": "1", "DELAY": "3"}, 0, 5, 1, 0, 0)
    >>> d = Delivery("T", b"{}", "U1", reconsume_times=1)
    >>> c = plan_copy(s, d, limit=2, levels=18, reason="boom")
    >>> c.reconsume_times, c.delay_level, c.dead, c.properties["DELAY"], c.properties["ckit_reason"]
    (2, 4, False, '4', 'boom')
    >>> plan_copy(s, d, limit=1, levels=18, reason="").dead
    True
    >>> busy = plan_copy(s, d, limit=1, levels=18, reason="busy", spend=False)
    >>> busy.dead, busy.reconsume_times, busy.delay_level
    (False, 1, 4)
    """
    props = {k: v for k, v in stored.properties.items() if k not in REWRITTEN}
    props.setdefault("RETRY_TOPIC", delivery.topic)
    props.setdefault("ORIGIN_MESSAGE_ID", stored.offset_msg_id or delivery.broker_message_id)
    props.setdefault("UNIQ_KEY", delivery.broker_message_id)  # the id the consumer saw
    if text := clip_reason(reason):
        props[PROP_REASON] = text
    count = stored.reconsume_times
    if dead or (spend and count >= limit):
        return Copy(props, max(count, limit) + 1, limit, 0, True)
    level = min(FIRST_RETRY_LEVEL + count, levels)
    props["DELAY"] = str(level)
    after = count + 1 if spend else count
    return Copy(props, after, max(limit, after) + 1, level, False)


def is_the_delivery(stored: StoredMessage, delivery: Delivery, group: str) -> bool:
    """Whether `stored` (read by commit log offset) is the message `delivery` came from."""
    if stored.topic not in (delivery.topic, retry_topic(group)):
        return False
    if (stored.queue_id, stored.queue_offset) != (delivery.queue_id, delivery.queue_offset):
        return False
    uniq = stored.properties.get("UNIQ_KEY")
    if uniq:
        return uniq == delivery.broker_message_id
    # no UNIQ_KEY: the client's id is its own form of the offset id, ending in the offset
    return delivery.broker_message_id[-16:] == f"{stored.commit_log_offset:016X}"


class _Cached:
    """One value read from the broker, trusted for `ttl` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._values: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, read: Callable[[], Any], *, fresh: bool = False) -> Any:
        """The cached value, or `read()` when there is none, it is too old, or `fresh`."""
        now = time.monotonic()
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and now - hit[0] < self.ttl and not fresh:
            return hit[1]
        value = read()
        with self._lock:
            self._values[key] = (now, value)
        return value



class SendBack:
    """Sends failed deliveries of one consumer group back to the broker (see the module doc).

    Thread-safe: every consume thread of the group calls `send_back`.
    """

    def __init__(self, admin: RocketMQAdmin, group: str, *,
                 cache_seconds: float = DEFAULT_CACHE_SECONDS,
                 patience: float = DEFAULT_PATIENCE) -> None:
        self.admin = admin
        self.group = group
        self.patience = patience
        self._cache = _Cached(cache_seconds)
        self._limit: int | None = None
        self._next_limit_read = 0.0

    def limit(self) -> int | None:
        """The group's `retryMaxTimes` as last read (read again when older than the cache time,
        at most once per cache time when the broker does not answer); None when unknown.
        Cheap: called for every delivery."""
        if time.monotonic() >= self._next_limit_read:
            self._next_limit_read = time.monotonic() + self._cache.ttl
            try:
                self._limit = self._group_limit(next(iter(self._masters().values())))
            except Exception as exc:  # a broker away or an answer it cannot read: keep the last
                log.warning("consumer %s: cannot read the group's retryMaxTimes: %s",
                            self.group, exc)
        return self._limit

    def send_back(self, delivery: Delivery, commit_log_offset: int, reason: str, *,
                  spend: bool = True, dead: bool = False,
                  until: Callable[[], bool] | None = None) -> SentBack:
        """Store the retry copy (or dead letter) of `delivery`, which failed with `reason`
        (`spend` False: a busy answer; `dead`: a dead letter at once; see `plan_copy`).

        Retries an unreachable or busy broker for `patience` seconds or, given `until`, until
        `until()` is true (a consumer passes "I am stopping": the native send-back it would fall
        back to meets the same unreachable broker, and this librocketmq build drops a message
        whose send-back failed), with one warning once `patience` has passed.

        Raises:
            TransportUnavailable: the broker stayed unreachable.
            TransportError: the stored message was not found (or on several brokers), or the
                broker refused the copy.
        """
        started = time.monotonic()
        pause = 0.1
        warned = False
        while True:
            try:
                return self._send_back(delivery, commit_log_offset, reason, spend, dead)
            except TransportUnavailable as exc:
                waited = time.monotonic() - started
                if until is None:
                    if waited + pause > self.patience:
                        raise
                elif until():
                    raise
                elif waited >= self.patience and not warned:
                    warned = True
                    log.warning("consumer %s: message %s: cannot send it back, the broker is "
                                "unreachable (%s); still trying until it answers or the "
                                "consumer stops", self.group, delivery.broker_message_id, exc)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _send_back(self, delivery: Delivery, offset: int, reason: str, spend: bool,
                   dead: bool = False) -> SentBack:
        broker, stored = self.locate(delivery, offset)
        limit = self._group_limit(broker)
        levels = self._cache.get(f"levels@{broker}", lambda: self._delay_levels(broker))
        copy = plan_copy(stored, delivery, limit=limit, levels=levels, reason=reason,
                         spend=spend, dead=dead)
        body = stored.body
        if stored.compressed:
            body = zlib.compress(body)
        self.admin.send_message(
            broker, topic=retry_topic(self.group), body=body, properties=copy.properties,
            producer_group=INNER_PRODUCER, born_timestamp_ms=stored.born_timestamp_ms,
            flag=stored.flag, sys_flag=SYSFLAG_COMPRESSED if stored.compressed else 0,
            reconsume_times=copy.reconsume_times, max_reconsume_times=copy.max_reconsume_times)
        topic = dlq_topic(self.group) if copy.dead else retry_topic(self.group)
        return SentBack(topic, broker, copy.reconsume_times, copy.delay_level)

    def locate(self, delivery: Delivery, offset: int) -> tuple[str, StoredMessage]:
        """The master broker that stores the delivered message, and the message as stored.

        Every master is asked (the offset is per broker); exactly one must hold a matching
        message. With several matches the copy could go to the wrong broker, so none is made.

        Raises:
            TransportUnavailable: no match, and a broker did not answer.
            TransportError: no match anywhere, or more than one.
        """
        found: list[tuple[str, StoredMessage]] = []
        unanswered: list[TransportUnavailable] = []
        for addr in self._masters().values():
            try:
                stored = self.admin.view_message(addr, offset)
            except TransportUnavailable as exc:
                unanswered.append(exc)
                continue
            if stored is not None and is_the_delivery(stored, delivery, self.group):
                found.append((addr, stored))
        if len(found) == 1:
            return found[0]
        if found:
            raise TransportError(f"message {delivery.broker_message_id} at commit log offset "
                                 f"{offset} matches on {len(found)} brokers "
                                 f"({', '.join(a for a, _ in found)}): not sending it back")
        if unanswered:
            raise unanswered[0]
        raise TransportError(f"message {delivery.broker_message_id} not found at commit log "
                             f"offset {offset} on any master broker")

    def _masters(self) -> dict[str, str]:
        masters: dict[str, str] = self._cache.get("masters", self.admin.master_brokers)
        return masters

    def _group_limit(self, broker: str) -> int:
        def read() -> dict[str, dict[str, Any]]:
            return self.admin.subscription_groups(broker)

        groups = self._cache.get(f"groups@{broker}", read)
        if self.group not in groups:  # created since the last read?
            groups = self._cache.get(f"groups@{broker}", read, fresh=True)
        config = groups.get(self.group) or {}
        return int(config.get("retryMaxTimes", DEFAULT_MAX_RECONSUME_TIMES))

    def _delay_levels(self, broker: str) -> int:
        levels = self.admin.broker_config(broker).get("messageDelayLevel", "").split()
        return len(levels) or len(DEFAULT_DELAY_LEVELS)
