"""Consuming the producer's receipt topic and applying what arrives (the engine of
`ckit receipts`)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from consumer_kit.core.errors import ReceiptError
from consumer_kit.core.messages import ConsumeStatus, Delivery, Subscription
from consumer_kit.core.receipt import read_receipts, receipt_topic
from consumer_kit.core.receipts_applier import ReceiptApplier, ReceiptResult
from consumer_kit.core.receipts_shards import ShardedReceiptApplier
from consumer_kit.transports.base import Consumer, Transport
from consumer_kit.transports.running import Activity
from outbox_producer import metrics
from outbox_producer.validation import check_producer

log = logging.getLogger(__name__)


class ReceiptConsumer:
    """Applies receipt messages as they arrive. Each message carries a batch, applied in one
    transaction before the broker is acked (so a crash at any point redelivers it, and applying
    it again changes nothing); a malformed message, or a malformed entry of one, is logged and
    dropped (it can never succeed: `malformed` counts them) while the batch's valid receipts
    are applied; a database error asks the broker to redeliver later."""

    def __init__(self, applier: ReceiptApplier | ShardedReceiptApplier, transport: Transport,
                 *, producer: str) -> None:
        self.applier = applier
        self.transport = transport
        self.topic = receipt_topic(check_producer(producer))
        self.group = f"ckit-receipts-{producer}"
        self.totals = ReceiptResult()
        self.malformed = 0
        self.activity = Activity()

    def __call__(self, delivery: Delivery) -> ConsumeStatus:
        self.activity.touch()
        try:
            receipts, errors = read_receipts(delivery.body)
        except ReceiptError as exc:
            self.malformed += 1
            metrics.RECEIPTS_DROPPED.labels("malformed").inc()
            log.error("receipt message %s dropped: %s", delivery.broker_message_id, exc)
            return ConsumeStatus.CONSUME_SUCCESS
        metrics.RECEIPTS_DROPPED.labels("malformed").inc(len(errors))
        for error in errors:
            self.malformed += 1
            log.error("receipt message %s: %s: dropped", delivery.broker_message_id, error)
        try:
            result = self.applier.apply(receipts)
        except DBAPIError as exc:
            log.warning("receipt message %s: database error, redeliver later: %s",
                        delivery.broker_message_id, exc.orig or exc)
            return ConsumeStatus.RECONSUME_LATER
        self.totals.add(result)
        metrics.RECEIPTS.labels("consumed").inc(result.consumed)
        metrics.RECEIPTS.labels("rejected").inc(result.rejected)
        metrics.RECEIPTS_DROPPED.labels("unknown").inc(result.unknown)
        log.debug("receipt message %s applied: %s", delivery.broker_message_id, result)
        return ConsumeStatus.CONSUME_SUCCESS

    def consumer(self, *, threads: int = 1) -> Consumer:
        """A transport consumer of the receipt topic with this object as its callback."""
        self.transport.ensure_topic(self.topic)
        return self.transport.consumer(self.group, [Subscription(self.topic)], self,
                                       threads=threads)
