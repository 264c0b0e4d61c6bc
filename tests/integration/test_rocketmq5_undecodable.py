"""A message whose body says it is base64 (`ckit_enc=b64`, as a `rocketmq://` sender marks one)
and is not can never reach a handler: the `rocketmq5://` consumer moves it to the dead letters at
once, as it travelled, with the reason, and acks it (it came back every invisible time until the
broker dead-lettered it, without a reason, and no row recorded it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumer_kit.testing.harness import unique, wait_for_dead_letters
from consumer_kit.transports import Subscription
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services
from tests.harnesses.rocketmq5 import transport as rocketmq5_transport
from tests.integration.foreign import Collected, RawProducer

pytestmark = [pytest.mark.rocketmq5, pytest.mark.rocketmq, pytest.mark.slow]


@pytest.fixture
def transport() -> Iterator[RocketMQ5Transport]:
    services.require("rocketmq5", services.ping_rocketmq5)
    made = rocketmq5_transport()
    yield made
    made.close()


def test_a_body_marked_base64_that_is_not_goes_to_the_dead_letters_at_once(
        transport: RocketMQ5Transport) -> None:
    assert transport.admin is not None
    topic, group = unique("undecodable5"), unique("undecodable5-g")
    transport.admin.create_typed_topic(topic, message_type="NORMAL", queues=1)
    seen = Collected()
    consumer = transport.consumer(group, [Subscription(topic)], seen, threads=1)
    consumer.start()
    try:
        # Given a 4.x producer's message marked base64 whose body is JSON, then a healthy one
        with RawProducer(services.rocketmq5_namesrv_addr()) as producer:
            producer.send(topic, {"order": 1}, keys="k-bad", properties={"ckit_enc": "b64"})
            producer.send(topic, {"order": 2}, keys="k-good")
            # When the consumer meets them
            assert seen.arrived.wait(60), "the healthy message did not arrive"
        # Then the handler saw only the healthy one, and the other is a dead letter with why
        [letter] = wait_for_dead_letters(lambda: transport.dead_letters(group), expect=1,
                                         timeout=60, interval=0.5)
        assert letter.keys == "k-bad"
        assert "undecodable body" in letter.last_error and "base64" in letter.last_error
        assert letter.body == b'{"order": 1}'
        assert [d.keys for d in seen.deliveries] == ["k-good"]
    finally:
        consumer.shutdown(10)
