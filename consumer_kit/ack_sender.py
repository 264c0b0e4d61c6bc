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
import time
from collections import defaultdict

from consumer_kit import metrics
from consumer_kit.batching import BatchWorker
from consumer_kit.transports.base import OutgoingMessage, Transport

log = logging.getLogger("consumer_kit.acks")

DEFAULT_BATCH = 200
DEFAULT_INTERVAL = 0.2
DEFAULT_ATTEMPTS = 3


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
        self.attempts = attempts
        #: acks given up (queue full or retries exhausted): left for the reconciler
        self.lost = 0
        self.worker: BatchWorker[tuple[str, object]] = BatchWorker(
            self._deliver_batch, name=f"ckit-acks-{group}", max_batch=batch,
            linger=interval).start()

    def put(self, producer: str, message_id: str, outcome: str, reason: str | None = None
            ) -> None:
        """Queue an ack; never blocks (a full queue drops it for the reconciler)."""
        from outbox_producer.acks import Ack, AckOutcome

        ack = Ack(message_id, self.group, AckOutcome(outcome), reason)
        if not self.worker.submit((producer, ack)):
            self._lost(1)
            log.warning("message %s: ack queue full, left for the reconciler", message_id)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued ack was delivered or given up."""
        return self.worker.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout`), then stop."""
        self.worker.close(timeout)
        self.route.close()

    def _lost(self, n: int) -> None:
        self.lost += n
        metrics.ACKS_LOST.labels(self.group).inc(n)

    def _deliver_batch(self, batch: list[tuple[str, object]]) -> None:
        by_producer: dict[str, list[object]] = defaultdict(list)
        for producer, ack in batch:
            by_producer[producer].append(ack)
        for producer, acks in by_producer.items():
            self._deliver(producer, acks)

    def _deliver(self, producer: str, acks: list[object]) -> None:
        for attempt in range(1, self.attempts + 1):
            try:
                self.route.deliver(producer, acks)
            except Exception as exc:
                log.warning("ack batch of %d for %s failed (attempt %d/%d, first message %s): %s",
                            len(acks), producer, attempt, self.attempts,
                            getattr(acks[0], "message_id", "?"), exc)
                time.sleep(min(2.0, 0.1 * 2 ** attempt))
                continue
            metrics.ACK_BATCHES.labels(self.group, self.route.name).inc()
            return
        log.error("ack batch of %d for %s given up (first message %s): the reconciler repairs it",
                  len(acks), producer, getattr(acks[0], "message_id", "?"))
        self._lost(len(acks))
