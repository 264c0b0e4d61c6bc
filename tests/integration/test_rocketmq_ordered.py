"""Ordered topics on the real broker: one sharding key's messages keep their order."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path

import pytest

from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from tests.harnesses.rocketmq import harness

PER_KEY = 30


@pytest.mark.rocketmq
def test_messages_of_one_sharding_key_arrive_in_order_on_one_queue(tmp_path: Path) -> None:
    from consumer_kit.transports.rocketmq import RocketMQTransport

    with harness(tmp_path) as h:
        # Given: an ordered topic and a transport that sends it by sharding key
        topic, group = h.topic("ordered"), h.group("g_ordered")
        transport = RocketMQTransport(h.transport.addr, producer_group=h.group("p_ordered"),
                                      ordered_topics=[topic],
                                      client_log_dir=str(tmp_path / "cpp-ordered"))
        seen: dict[str, list[int]] = defaultdict(list)
        queues: dict[str, set[int]] = defaultdict(set)
        lock = threading.Lock()

        def record(delivery: Delivery) -> ConsumeStatus:
            key, seq = delivery.body.decode().split(":")
            with lock:
                seen[key].append(int(seq))
                queues[key].add(delivery.queue_id)
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = transport.consumer(group, [Subscription(topic)], record, threads=4)
        consumer.start()
        try:
            # When: two keys interleaved
            for seq in range(PER_KEY):
                for key in ("order-A", "order-B"):
                    transport.send(OutgoingMessage(topic, f"{key}:{seq}".encode(),
                                                   sharding_key=key))
            assert wait_for(lambda: sum(len(v) for v in seen.values()) >= 2 * PER_KEY,
                            h.timeout)
        finally:
            consumer.shutdown()
            transport.close()
        # Then: each key's messages in send order, all from one queue
        assert seen == {key: list(range(PER_KEY)) for key in ("order-A", "order-B")}
        assert all(len(q) == 1 for q in queues.values())
