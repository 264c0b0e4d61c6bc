"""Ordered delivery on RocketMQ 5: a FIFO topic, a FIFO consumer group, and the message group of
each send (its sharding key) keep one key's messages in order, a redelivery included."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from consumer_kit.testing.harness import unique, wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from tests import services
from tests.harnesses.rocketmq5 import transport as make_transport

PER_KEY = 20
FAIL_ONCE = ("order-A", 5)
pytestmark = [pytest.mark.rocketmq5]


def test_one_message_group_arrives_in_order_and_a_redelivery_holds_the_group_back() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given: a FIFO topic, a FIFO group, a transport that sends the topic with message groups
    topic, group = unique("ordered5"), unique("g_ordered5")
    transport = make_transport(ordered_topics=[topic], create_topics=True,
                               max_reconsume_times=3)
    seen: dict[str, list[int]] = defaultdict(list)
    failed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def record(delivery: Delivery) -> ConsumeStatus:
        key, seq = delivery.body.decode().split(":")
        with lock:
            seen[key].append(int(seq))
            if (key, int(seq)) == FAIL_ONCE and not failed:
                failed.append(FAIL_ONCE)
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(group, [Subscription(topic)], record, threads=4)
    consumer.start()
    try:
        # When: two keys interleaved, one message of A answered RECONSUME_LATER once
        for seq in range(PER_KEY):
            for key in ("order-A", "order-B"):
                transport.send(OutgoingMessage(topic, f"{key}:{seq}".encode(), sharding_key=key))
        assert wait_for(lambda: len(seen["order-A"]) >= PER_KEY + 1
                        and len(seen["order-B"]) >= PER_KEY, 60)
    finally:
        consumer.shutdown()
        transport.close()
    # Then: B in order; A in order with 5 delivered again before 6 was ever delivered
    assert seen["order-B"] == list(range(PER_KEY))
    assert seen["order-A"] == [*range(6), 5, *range(6, PER_KEY)]
