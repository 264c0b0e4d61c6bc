"""Ordered delivery on RocketMQ 5: a FIFO topic, a FIFO consumer group, and the message group of
each send (its sharding key) keep one key's messages in order, a redelivery included."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from consumer_kit.core.errors import TransportError
from consumer_kit.testing.harness import unique, wait_for, wait_for_dead_letters
from consumer_kit.transports import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
    Verdict,
)
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
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


def _order_with_one_redelivery(producer: RocketMQ5Transport, consumer_side: RocketMQ5Transport,
                               topic: str, group: str, count: int = 12) -> list[int]:
    """Send `count` messages of one key; message 5 is answered RECONSUME_LATER once."""
    seen: list[int] = []
    lock = threading.Lock()

    def record(delivery: Delivery) -> ConsumeStatus:
        seq = int(delivery.body.decode())
        with lock:
            seen.append(seq)
            if seq == 5 and seen.count(5) == 1:
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = consumer_side.consumer(group, [Subscription(topic)], record, threads=4)
    consumer.start()
    try:
        for seq in range(count):
            producer.send(OutgoingMessage(topic, str(seq).encode(), sharding_key="K"))
        assert wait_for(lambda: len(seen) >= count + 1, 60)
    finally:
        consumer.shutdown()
    return seen


def test_ordered_topics_with_create_topics_make_the_group_fifo_without_a_retry_limit() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given: an ordered topic, create_topics, and no max_reconsume_times
    topic, group = unique("ordered5_nolimit"), unique("g_ordered5_nolimit")
    transport = make_transport(ordered_topics=[topic], create_topics=True)
    try:
        # When: one message of the key is answered RECONSUME_LATER once
        seen = _order_with_one_redelivery(transport, transport, topic, group)
    finally:
        transport.close()
    # Then: the group was made FIFO, so the redelivery held the key back
    assert seen == [*range(6), 5, *range(6, 12)]


def test_a_retry_limit_never_turns_an_operators_fifo_group_into_a_normal_one() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given: a FIFO topic and a FIFO group made by an operator (16 retries)
    topic, group = unique("ordered5_op"), unique("g_ordered5_op")
    producer = make_transport(ordered_topics=[topic])
    assert producer.admin is not None
    producer.admin.create_typed_topic(topic, message_type="FIFO", queues=4)
    producer.admin.update_group(group, retry_max_times=16, fifo=True)
    # ... and a consumer that sets a retry limit without listing the topic as ordered
    consumer_side = make_transport(max_reconsume_times=3)
    try:
        # When
        seen = _order_with_one_redelivery(producer, consumer_side, topic, group)
    finally:
        consumer_side.close()
        producer.close()
    # Then: the group is still FIFO: in order, the redelivery first
    assert seen == [*range(6), 5, *range(6, 12)]


@pytest.mark.parametrize("ordered", [True, False])
def test_a_fifo_topic_consumed_through_a_group_that_is_not_fifo_is_refused_at_start(
        ordered: bool) -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given: a FIFO topic (listed in ordered_topics, or not) and a normal group the transport
    # does not write
    topic, group = unique("ordered5_plain"), unique("g_ordered5_plain")
    transport = make_transport(ordered_topics=[topic] if ordered else [])
    assert transport.admin is not None
    transport.admin.create_typed_topic(topic, message_type="FIFO", queues=4)
    transport.admin.update_group(group, retry_max_times=16, fifo=False)
    consumer = transport.consumer(group, [Subscription(topic)],
                                  lambda d: ConsumeStatus.CONSUME_SUCCESS)
    why = (rf"consumer group {group} is not a FIFO group on the cluster, but its topics .* are "
           r"in ordered_topics" if ordered else
           rf"topic {topic} is a FIFO topic but consumer group {group} is not a FIFO group")
    try:
        # When / Then: one clear error, nothing consumed out of order
        with pytest.raises(TransportError, match=why):
            consumer.start()
    finally:
        consumer.shutdown()
        transport.close()


def test_a_fifo_message_out_of_retries_reaches_the_dead_letters_with_its_reason() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given: a FIFO topic and group allowing one reconsume, message 1 always refused
    topic, group = unique("ordered5_dlq"), unique("g_ordered5_dlq")
    transport = make_transport(ordered_topics=[topic], create_topics=True,
                               max_reconsume_times=1)
    handled: list[int] = []

    def refuse_one(delivery: Delivery) -> ConsumeStatus | Verdict:
        seq = int(delivery.body.decode())
        handled.append(seq)
        if seq == 1:
            return Verdict(ConsumeStatus.RECONSUME_LATER, "poison pill")
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(group, [Subscription(topic)], refuse_one, threads=2)
    consumer.start()
    try:
        # When: its retries run out (the message carries the proxy's `__SHARDINGKEY`)
        for seq in range(3):
            transport.send(OutgoingMessage(topic, str(seq).encode(), sharding_key="K"))
        dead = wait_for_dead_letters(lambda: transport.dead_letters(group), expect=1,
                                     timeout=60, interval=0.5)
        assert wait_for(lambda: 2 in handled, 30)
    finally:
        consumer.shutdown()
        transport.close()
    # Then: the transport's own copy holds the reason (not the broker's, which keeps none)
    assert [(d.body, d.topic, d.last_error) for d in dead] == [(b"1", topic, "poison pill")]
