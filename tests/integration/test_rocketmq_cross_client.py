"""Bodies across the two RocketMQ clients on one RocketMQ 5.3.3 cluster (scripts/rocketmq5.sh):
a body sent by one client reaches a handler of the other byte for byte.

The `rocketmq://` (4.x) sender base64-encodes a body that is not NUL-free UTF-8 (`ckit_enc`);
the `rocketmq5://` receiver decodes it. The `rocketmq5://` sender (and a Java or Go producer)
sends raw bytes; the 4.x receiver reads the whole body, not the C string its client hands out,
which ends at the first NUL byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from consumer_kit.testing.harness import unique
from consumer_kit.transports import Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.base import Transport
from consumer_kit.transports.rocketmq import RocketMQTransport
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services
from tests.harnesses.rocketmq5 import transport as rocketmq5_transport
from tests.integration.foreign import Collected

pytestmark = [pytest.mark.rocketmq5, pytest.mark.rocketmq, pytest.mark.slow]

#: NUL bytes, bytes that are not UTF-8, and text after the first NUL
BINARY = b"head\x00\x01\xfftail after the NUL\x00"


@pytest.fixture
def clients() -> Iterator[tuple[RocketMQTransport, RocketMQ5Transport]]:
    services.require("rocketmq5", services.ping_rocketmq5)
    v5 = rocketmq5_transport()
    v4 = RocketMQTransport(services.rocketmq5_namesrv_addr(), producer_group=unique("cross-p"))
    yield v4, v5
    v4.close()
    v5.close()


def receive_one(receiver: Transport, v5: RocketMQ5Transport, stem: str,
                send: Callable[[str], object]) -> Delivery:
    """Make a NORMAL topic on the 5.x cluster, consume it with `receiver`, `send(topic)`, and
    return the one delivery."""
    assert v5.admin is not None
    topic = unique(stem)
    v5.admin.create_typed_topic(topic, message_type="NORMAL", queues=1)
    seen = Collected()
    consumer = receiver.consumer(unique("cross-g"), [Subscription(topic)], seen, threads=1)
    consumer.start()
    try:
        send(topic)
        assert seen.arrived.wait(60), "the message did not arrive within 60 s"
    finally:
        consumer.shutdown(10)
    return seen.deliveries[0]


def test_a_binary_body_sent_by_the_4x_client_reaches_a_5x_handler_decoded(
        clients: tuple[RocketMQTransport, RocketMQ5Transport]) -> None:
    v4, v5 = clients
    delivery = receive_one(v5, v5, "cross-b64", lambda topic: v4.send(OutgoingMessage(
        topic, BINARY, keys=("k-b64",), properties={"region": "eu"})))
    assert delivery.body == BINARY
    assert delivery.properties == {"region": "eu"}  # no ckit_enc, no ckit_props


def test_a_body_with_nul_bytes_sent_by_the_5x_client_reaches_a_4x_handler_whole(
        clients: tuple[RocketMQTransport, RocketMQ5Transport]) -> None:
    v4, v5 = clients
    delivery = receive_one(v4, v5, "cross-nul", lambda topic: v5.send(OutgoingMessage(
        topic, BINARY, keys=("k-nul",))))
    assert delivery.body == BINARY
