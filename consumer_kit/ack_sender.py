"""Acks back to the producer: batched on a background thread, off the hot path.

Two routes: `topic` sends one ack message per batch to `ckit-ack-<producer>` on the consumer's
transport (applied there by `ckit acks`); `sql` applies the batch straight to the producer's
database with the producer half's `AckApplier`. A failed batch is retried a few times and then
given up (logged, counted): the reconciler repairs lost acks. Nothing here ever blocks or fails
a message.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
import time
from collections import defaultdict

from consumer_kit import metrics
from consumer_kit.transports.base import OutgoingMessage, Transport

log = logging.getLogger("consumer_kit.acks")

DEFAULT_BATCH = 200
DEFAULT_INTERVAL = 0.2
DEFAULT_ATTEMPTS = 3
DEFAULT_QUEUE_SIZE = 100_000


class AckRoute(abc.ABC):
    """Delivers a batch of acks for one producer."""

    name = ""

    @abc.abstractmethod
    def deliver(self, producer: str, acks: list[object]) -> None:
        """Deliver `acks` (outbox_producer `Ack` objects); raise on failure."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class TopicRoute(AckRoute):
    """One ack message per batch on the producer's ack topic."""

    name = "topic"

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def deliver(self, producer: str, acks: list[object]) -> None:
        from outbox_producer.acks import ack_topic, encode_acks

        self.transport.send(OutgoingMessage(ack_topic(producer), encode_acks(acks)))  # type: ignore[arg-type]


class SqlRoute(AckRoute):
    """Applies acks directly to the producer's database."""

    name = "sql"

    def __init__(self, url: str, *, outbox_table: str | None = None,
                 ack_table: str | None = None) -> None:
        from outbox_producer.acks import AckApplier

        options = {k: v for k, v in (("table", outbox_table), ("ack_table_name", ack_table)) if v}
        self.applier = AckApplier(url, updated_by="consumer-ack", **options)  # type: ignore[arg-type]

    def deliver(self, producer: str, acks: list[object]) -> None:
        self.applier.apply(acks)  # type: ignore[arg-type]

    def close(self) -> None:
        self.applier.engine.dispose()


class AckSender:
    """Queues acks and delivers them in batches per producer on a daemon thread."""

    def __init__(self, route: AckRoute, group: str, *, batch: int = DEFAULT_BATCH,
                 interval: float = DEFAULT_INTERVAL, attempts: int = DEFAULT_ATTEMPTS) -> None:
        self.route = route
        self.group = group
        self.batch = batch
        self.interval = interval
        self.attempts = attempts
        self.queue: queue.Queue[tuple[str, object]] = queue.Queue(DEFAULT_QUEUE_SIZE)
        self.delivered = 0
        self.lost = 0
        self._pending = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ckit-acks-{group}", daemon=True)
        self._thread.start()

    def put(self, producer: str, message_id: str, outcome: str, reason: str | None = None
            ) -> None:
        """Queue an ack; never blocks (a full queue drops it for the reconciler)."""
        from outbox_producer.acks import Ack, AckOutcome

        ack = Ack(message_id, self.group, AckOutcome(outcome), reason)
        with self._cond:
            self._pending += 1
        try:
            self.queue.put_nowait((producer, ack))
        except queue.Full:
            self._done(1, lost=True)
            log.warning("message %s: ack queue full, left for the reconciler", message_id)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued ack was delivered or given up."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout`), then stop."""
        self.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)
        self.route.close()

    def _done(self, n: int, *, lost: bool = False) -> None:
        with self._cond:
            self._pending -= n
            if lost:
                self.lost += n
            else:
                self.delivered += n
            self._cond.notify_all()

    def _collect(self) -> dict[str, list[object]]:
        by_producer: dict[str, list[object]] = defaultdict(list)
        try:
            producer, ack = self.queue.get(timeout=self.interval)
        except queue.Empty:
            return by_producer
        by_producer[producer].append(ack)
        deadline = time.monotonic() + self.interval
        total = 1
        while total < self.batch and time.monotonic() < deadline:
            try:
                producer, ack = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            by_producer[producer].append(ack)
            total += 1
        return by_producer

    def _run(self) -> None:
        while not (self._stop.is_set() and self.queue.empty()):
            for producer, acks in self._collect().items():
                self._deliver(producer, acks)

    def _deliver(self, producer: str, acks: list[object]) -> None:
        for attempt in range(1, self.attempts + 1):
            try:
                self.route.deliver(producer, acks)
            except Exception as exc:
                log.warning("ack batch of %d for %s failed (attempt %d/%d, first message %s): %s",
                            len(acks), producer, attempt, self.attempts,
                            getattr(acks[0], "message_id", "?"), exc)
                self._stop.wait(min(2.0, 0.1 * 2 ** attempt))
                continue
            metrics.ACK_BATCHES.labels(self.group, self.route.name).inc()
            self._done(len(acks))
            return
        metrics.ACKS_LOST.labels(self.group).inc(len(acks))
        log.error("ack batch of %d for %s given up (first message %s): the reconciler repairs it",
                  len(acks), producer, getattr(acks[0], "message_id", "?"))
        self._done(len(acks), lost=True)
