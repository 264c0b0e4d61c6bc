"""Consuming the ack topic and applying what arrives (the engine of `ckit acks`)."""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from consumer_kit.runner import Activity
from consumer_kit.transports.base import Consumer, ConsumeStatus, Delivery, Subscription, Transport
from outbox_producer.acks import AckApplier, AckResult, ack_topic, decode_acks
from outbox_producer.errors import AckError

log = logging.getLogger("consumer_kit.outbox.acks")


class AckConsumer:
    """Applies ack messages as they arrive. Each ack message carries a batch, applied in one
    transaction before the broker is acked; a malformed message is logged and dropped (it can
    never succeed), a database error asks the broker to redeliver later."""

    def __init__(self, applier: AckApplier, transport: Transport, *, producer: str) -> None:
        self.applier = applier
        self.transport = transport
        self.topic = ack_topic(producer)
        self.group = f"ckit-acks-{producer}"
        self.totals = AckResult()
        self.malformed = 0
        self.activity = Activity()

    def __call__(self, delivery: Delivery) -> ConsumeStatus:
        self.activity.touch()
        try:
            acks = decode_acks(delivery.body)
        except AckError as exc:
            self.malformed += 1
            log.error("ack message %s dropped: %s", delivery.broker_message_id, exc)
            return ConsumeStatus.CONSUME_SUCCESS
        try:
            result = self.applier.apply(acks)
        except DBAPIError as exc:
            log.warning("ack message %s: database error, redeliver later: %s",
                        delivery.broker_message_id, exc.orig or exc)
            return ConsumeStatus.RECONSUME_LATER
        self.totals.add(result)
        log.debug("ack message %s applied: %s", delivery.broker_message_id, result)
        return ConsumeStatus.CONSUME_SUCCESS

    def consumer(self, *, threads: int = 1) -> Consumer:
        """A transport consumer of the ack topic with this object as its callback."""
        self.transport.ensure_topic(self.topic)
        return self.transport.consumer(self.group, [Subscription(self.topic)], self,
                                       threads=threads)
