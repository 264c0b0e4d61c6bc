"""In-process transport for unit tests and demos: RocketMQ's semantics without a broker.

Topics are logs; each consumer group has an offset per topic (clustering: a message goes to one
consumer of a group, and to every group); delayed sends wait in a schedule; RECONSUME_LATER
re-queues with back-off and moves the message to the group's dead-letter list after
`max_reconsume_times` (each copy carries the callback's reason as `last_error`). Each transport
has its own broker unless given one: to connect a producer and a consumer, pass them the same
`MemoryTransport` (or `MemoryBroker`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Sequence

from consumer_kit.core.clock import epoch_ms
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    DeliveryCallback,
    OutgoingMessage,
    SendResult,
    Subscription,
    Verdict,
    as_verdict,
    tag_matches,
)
from consumer_kit.core.raised import describe_exception
from consumer_kit.transports.base import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_RECONSUME_TIMES,
    DEFAULT_RETRY_DELAYS,
    Consumer,
    Transport,
    check_body_size,
    clip_reason,
    retry_delay,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(order=True)
class _Scheduled:
    due: float
    seq: int
    delivery: Delivery = dataclasses.field(compare=False)


class MemoryBroker:
    """The shared state behind one or more `MemoryTransport`s (a broker in a dict)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.logs: dict[str, list[Delivery]] = {}
        self.offsets: dict[tuple[str, str], int] = {}
        self.schedule: list[_Scheduled] = []  # delayed sends, not yet in a topic log
        self.retries: dict[str, list[_Scheduled]] = {}  # per group
        self.dlq: dict[str, list[Delivery]] = {}
        self.seq = itertools.count()

    def promote_due(self, now: float) -> None:
        """Append delayed messages whose time has come to their topic logs (lock held)."""
        while self.schedule and self.schedule[0].due <= now:
            item = heapq.heappop(self.schedule)
            self.append(item.delivery)

    def append(self, delivery: Delivery) -> Delivery:
        log_ = self.logs.setdefault(delivery.topic, [])
        stored = dataclasses.replace(delivery, queue_offset=len(log_))
        log_.append(stored)
        self.cond.notify_all()
        return stored


class MemoryTransport(Transport):
    """The `memory://` transport (unit tests): a broker in this process's memory."""

    scheme = "memory"
    shared_across_processes = False

    def __init__(
        self,
        *,
        broker: MemoryBroker | None = None,
        retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.broker = broker or MemoryBroker()
        self.retry_delays = tuple(retry_delays)
        self.max_reconsume_times = max_reconsume_times
        self.max_body_bytes = max_body_bytes

    def send(self, message: OutgoingMessage) -> SendResult:
        check_body_size(message.body, self.max_body_bytes)
        delivery = Delivery(
            topic=message.topic,
            body=bytes(message.body),
            broker_message_id=uuid.uuid4().hex.upper(),
            tags=message.tags or "",
            keys=" ".join(message.keys),
            properties=dict(message.properties),
            born_timestamp_ms=epoch_ms(),
        )
        broker = self.broker
        with broker.cond:
            if message.delay and message.delay > 0:
                heapq.heappush(
                    broker.schedule,
                    _Scheduled(time.monotonic() + message.delay, next(broker.seq), delivery),
                )
                broker.cond.notify_all()
                return SendResult(delivery.broker_message_id)
            stored = broker.append(delivery)
        return SendResult(stored.broker_message_id, 0, stored.queue_offset)

    def consumer(
        self,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: DeliveryCallback,
        *,
        threads: int = 1,
    ) -> MemoryConsumer:
        return MemoryConsumer(self, group, subscriptions, callback, threads=threads)

    def dead_letters(self, group: str) -> list[Delivery]:
        """Messages of `group` that exhausted their reconsume times (`%DLQ%group`)."""
        with self.broker.cond:
            return list(self.broker.dlq.get(group, []))


class MemoryConsumer(Consumer):
    """Worker threads that pull from a `MemoryBroker` for one group."""

    def __init__(
        self,
        transport: MemoryTransport,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: DeliveryCallback,
        *,
        threads: int,
    ) -> None:
        self.transport = transport
        self.broker = transport.broker
        self.group = group
        self.subscriptions = list(subscriptions)
        self.callback = callback
        self.threads = max(1, threads)
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def start(self) -> None:
        for index in range(self.threads):
            worker = threading.Thread(
                target=self._run, name=f"ckit-memory-{self.group}-{index}", daemon=True
            )
            worker.start()
            self._workers.append(worker)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self.broker.cond:
            self.broker.cond.notify_all()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self._workers.clear()

    def ready(self) -> int:
        with self.broker.cond:
            now = time.monotonic()
            self.broker.promote_due(now)
            # redeliveries still waiting for their time count too: burst runs wait for them
            count = len(self.broker.retries.get(self.group, []))
            for sub in self.subscriptions:
                log_ = self.broker.logs.get(sub.topic, [])
                start = self.broker.offsets.get((self.group, sub.topic), 0)
                count += sum(1 for d in log_[start:] if tag_matches(sub.expression, d.tags))
            return count

    def _take(self) -> Delivery | None:
        """Next delivery for this group, or None (lock held by the caller)."""
        broker = self.broker
        now = time.monotonic()
        broker.promote_due(now)
        retries = broker.retries.get(self.group)
        if retries and retries[0].due <= now:
            return self._mine(heapq.heappop(retries).delivery)
        for sub in self.subscriptions:
            log_ = broker.logs.get(sub.topic, [])
            key = (self.group, sub.topic)
            offset = broker.offsets.get(key, 0)
            while offset < len(log_):
                delivery = log_[offset]
                offset += 1
                broker.offsets[key] = offset
                if tag_matches(sub.expression, delivery.tags):
                    return self._mine(delivery)
        return None

    def _mine(self, delivery: Delivery) -> Delivery:
        """The delivery as this group sees it (the log is shared by every group)."""
        return dataclasses.replace(
            delivery, max_reconsume_times=self.transport.max_reconsume_times)

    def _next_wakeup(self) -> float:
        dues = [s.due for s in self.broker.schedule[:1]]
        dues += [s.due for s in self.broker.retries.get(self.group, [])[:1]]
        return max(0.001, min(dues) - time.monotonic()) if dues else 0.5

    def _run(self) -> None:
        broker = self.broker
        while not self._stop.is_set():
            with broker.cond:
                delivery = self._take()
                if delivery is None:
                    broker.cond.wait(self._next_wakeup())
                    continue
                self._in_flight += 1
            try:
                verdict = self._call(delivery)
            finally:
                with broker.cond:
                    self._in_flight -= 1
            if verdict.status is not ConsumeStatus.CONSUME_SUCCESS:
                self._reconsume_later(delivery, verdict.reason, spend=verdict.spend)

    def _call(self, delivery: Delivery) -> Verdict:
        try:
            return as_verdict(self.callback(delivery))
        except Exception as exc:  # the transport contract: an exception means RECONSUME_LATER
            log.exception("callback raised for message %s; reconsume later",
                          delivery.broker_message_id)
            return Verdict(ConsumeStatus.RECONSUME_LATER, describe_exception(exc))

    def _reconsume_later(self, delivery: Delivery, reason: str, *, spend: bool = True) -> None:
        transport = self.transport
        attempt = delivery.reconsume_times + (1 if spend else 0)
        delivery = dataclasses.replace(delivery, last_error=clip_reason(reason))
        with self.broker.cond:
            if spend and attempt > transport.max_reconsume_times:
                self.broker.dlq.setdefault(self.group, []).append(delivery)
                log.warning("message %s moved to %%DLQ%%%s after %d reconsumes",
                            delivery.broker_message_id, self.group, delivery.reconsume_times)
                return
            delay = retry_delay(transport.retry_delays, delivery.reconsume_times)
            heapq.heappush(
                self.broker.retries.setdefault(self.group, []),
                _Scheduled(time.monotonic() + delay, next(self.broker.seq),
                           dataclasses.replace(delivery, reconsume_times=attempt)),
            )
            self.broker.cond.notify_all()
