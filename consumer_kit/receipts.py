"""Receipts back to the producer: batched on a background thread, off the hot path.

Two routes: `topic` sends one receipt message per batch to `ckit-receipt-<producer>` on the
consumer's transport (applied there by `ckit receipts`); `sql` applies the batch straight to the
producer's database with the core's `ReceiptApplier`. A failed batch is retried a few times and
then given up (logged, counted): the reconciler repairs lost receipts. Nothing here ever blocks
or fails a message.
"""

from __future__ import annotations

import abc
import logging
import time
from collections import defaultdict

from consumer_kit import metrics
from consumer_kit.core.batching import BatchWorker
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.receipt import Receipt, ReceiptOutcome, encode_receipts, receipt_topic
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.schema import DEFAULT_OUTBOX_TABLE, DEFAULT_RECEIPT_TABLE
from consumer_kit.transports.base import Transport

log = logging.getLogger(__name__)

DEFAULT_BATCH = 200
DEFAULT_INTERVAL = 0.2
DEFAULT_ATTEMPTS = 3


class ReceiptRoute(abc.ABC):
    """Delivers a batch of acks for one producer."""

    name = ""

    @abc.abstractmethod
    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        """Deliver `receipts` to `producer`; raise on failure."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class TopicRoute(ReceiptRoute):
    """One receipt message per batch on the producer's receipt topic."""

    name = "topic"

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        self.transport.send(OutgoingMessage(receipt_topic(producer), encode_receipts(receipts)))


class SqlRoute(ReceiptRoute):
    """Applies receipts directly to the producer's database."""

    name = "sql"

    def __init__(self, url: str, *, outbox_table: str | None = None,
                 receipt_table: str | None = None) -> None:
        self.applier = ReceiptApplier(url, table=outbox_table or DEFAULT_OUTBOX_TABLE,
                                      receipt_table_name=receipt_table or DEFAULT_RECEIPT_TABLE,
                                      updated_by="consumer-receipts")

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        self.applier.apply(receipts)

    def close(self) -> None:
        self.applier.engine.dispose()


class ReceiptSender:
    """Queues acks and delivers them in batches per producer on a daemon thread."""

    def __init__(self, route: ReceiptRoute, group: str, *, batch: int = DEFAULT_BATCH,
                 interval: float = DEFAULT_INTERVAL, attempts: int = DEFAULT_ATTEMPTS) -> None:
        self.route = route
        self.group = group
        self.attempts = attempts
        #: acks given up (queue full or retries exhausted): left for the reconciler
        self.lost = 0
        self.worker: BatchWorker[tuple[str, Receipt]] = BatchWorker(
            self._deliver_batch, name=f"ckit-acks-{group}", max_batch=batch,
            linger=interval).start()

    def put(self, producer: str, message_id: str, outcome: str, reason: str | None = None
            ) -> None:
        """Queue an ack; never blocks (a full queue drops it for the reconciler)."""
        ack = Receipt(message_id, self.group, ReceiptOutcome(outcome), reason)
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

    def _deliver_batch(self, batch: list[tuple[str, Receipt]]) -> None:
        by_producer: dict[str, list[Receipt]] = defaultdict(list)
        for producer, ack in batch:
            by_producer[producer].append(ack)
        for producer, acks in by_producer.items():
            self._deliver(producer, acks)

    def _deliver(self, producer: str, acks: list[Receipt]) -> None:
        for attempt in range(1, self.attempts + 1):
            try:
                self.route.deliver(producer, acks)
            except Exception as exc:
                log.warning("ack batch of %d for %s failed (attempt %d/%d, first message %s): %s",
                            len(acks), producer, attempt, self.attempts,
                            acks[0].message_id, exc)
                time.sleep(min(2.0, 0.1 * 2 ** attempt))
                continue
            metrics.ACK_BATCHES.labels(self.group, self.route.name).inc()
            return
        log.error("ack batch of %d for %s given up (first message %s): the reconciler repairs it",
                  len(acks), producer, acks[0].message_id)
        self._lost(len(acks))
