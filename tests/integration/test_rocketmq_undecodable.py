"""A message whose body says it is base64 (`ckit_enc=b64`) and is not can never reach a handler:
the `rocketmq://` consumer moves it to the dead-letter queue at once, as it travelled, with the
reason, and acks it (it was retried with its batch for hours before, and no row recorded it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumer_kit.testing.harness import unique, wait_for_dead_letters
from consumer_kit.transports import Subscription
from consumer_kit.transports.rocketmq import RocketMQTransport
from tests import services
from tests.integration.foreign import Collected, RawProducer

pytestmark = [pytest.mark.rocketmq, pytest.mark.slow]


@pytest.fixture
def transport() -> Iterator[RocketMQTransport]:
    services.require("rocketmq", services.ping_rocketmq)
    made = RocketMQTransport(services.rocketmq_addr(), producer_group=unique("undecodable-p"),
                             create_topics=True)
    yield made
    made.close()


def test_a_body_marked_base64_that_is_not_goes_to_the_dead_letters_at_once(
        transport: RocketMQTransport) -> None:
    topic = unique("undecodable")
    transport.ensure_topic(topic)
    dead_letter_then_healthy_one(transport, topic)


def test_an_ordered_queue_moves_an_undecodable_message_to_the_dead_letters_and_goes_on() -> None:
    services.require("rocketmq", services.ping_rocketmq)
    topic = unique("undecodable-ord")
    # one queue, consumed in order: the healthy message waits behind the undecodable one (it
    # used to wait for good: the undecodable one was retried in place, with no limit)
    ordered = RocketMQTransport(services.rocketmq_addr(), producer_group=unique("undecodable-p"),
                                create_topics=True, topic_queues=1, ordered_topics=[topic])
    try:
        ordered.ensure_topic(topic)
        dead_letter_then_healthy_one(ordered, topic)
    finally:
        ordered.close()


def dead_letter_then_healthy_one(transport: RocketMQTransport, topic: str) -> None:
    group = unique("undecodable-g")
    seen = Collected()
    consumer = transport.consumer(group, [Subscription(topic)], seen, threads=1)
    consumer.start()
    try:
        # Given a foreign producer's message marked base64 whose body is JSON, then a healthy one
        with RawProducer(services.rocketmq_addr()) as producer:
            bad = producer.send(topic, {"order": 1}, keys="k-bad",
                                properties={"ckit_enc": "b64"})
            producer.send(topic, {"order": 2}, keys="k-good")
            # When the consumer meets them, then the healthy one arrives
            assert seen.arrived.wait(60), "the healthy message did not arrive"
        # and the handler saw only it: the other is a dead letter with why
        [letter] = wait_for_dead_letters(lambda: transport.dead_letters(group), expect=1,
                                         timeout=60, interval=0.5)
        assert letter.broker_message_id == bad
        assert "undecodable body" in letter.last_error and "base64" in letter.last_error
        assert [d.keys for d in seen.deliveries] == ["k-good"]
    finally:
        consumer.shutdown(10)
