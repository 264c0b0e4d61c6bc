"""A `rocketmq5://` consumer keeps receiving after its proxy is killed and restarted.

A restarted proxy has forgotten the client's settings and answers every receive with an error
until the client sends them again, which rocketmq-python-client 5.1.2 does on its own only
every 300 s (the fault runs saw 120-154 s without any effect). The consumer re-sends them after
a failed receive. This test runs a 5.x name server + proxy of its own (scripts/rocketmq5.sh on
offset ports, run folder in tmp_path; the standing instance is not touched), kills the proxy
with SIGKILL, starts it again and times the first delivery after the proxy answers.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults.services import RocketMQ5
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services
from tests.harnesses.rocketmq5 import FAST_OPTIONS

pytestmark = [pytest.mark.rocketmq5, pytest.mark.slow]

#: ports of this test's own 5.x (the standing one uses 9886, 10951, 8081)
OFFSET = 31_000
#: after the proxy answers again, the first message must arrive within this (the client's own
#: settings schedule would take up to 300 s)
BACK_WITHIN = 45.0


@pytest.fixture
def private_5x(tmp_path: Path) -> Iterator[RocketMQ5]:
    services.require("rocketmq5", services.ping_rocketmq5)  # the jars and client are installed
    if shutil.which("java") is None:
        pytest.skip("java is missing: run scripts/setup.sh")
    broker = RocketMQ5(tmp_path / "rmq5", 9886 + OFFSET, 10951 + OFFSET, 8081 + OFFSET)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def test_a_consumer_receives_again_soon_after_its_proxy_is_killed_and_restarted(
        private_5x: RocketMQ5) -> None:
    # Given: a consumer receiving from a proxy of our own
    transport = RocketMQ5Transport(
        f"rocketmq5://{private_5x.proxy_addr}?namesrv={private_5x.addr}", **FAST_OPTIONS)
    topic, group = f"ckit_restart_{uuid.uuid4().hex[:8]}", f"g_restart_{uuid.uuid4().hex[:8]}"
    transport.ensure_topic(topic)
    got: list[bytes] = []
    lock = threading.Lock()

    def callback(delivery: Delivery) -> ConsumeStatus:
        with lock:
            got.append(delivery.body)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(group, [Subscription(topic)], callback, threads=2)
    consumer.start()
    try:
        transport.send(OutgoingMessage(topic, b"before"))
        assert wait_for(lambda: b"before" in got, 60), "nothing received before the restart"
        # When: the proxy (and the broker inside it) is killed and started again
        private_5x.kill9("proxy")
        private_5x.start()
        answered = time.monotonic()
        sent = False
        deadline = answered + BACK_WITHIN
        while time.monotonic() < deadline and not sent:
            try:
                transport.send(OutgoingMessage(topic, b"after"))
                sent = True
            except Exception:  # the producer's route may need a moment too
                time.sleep(1)
        # Then: the consumer gets it soon, not after the client's 300 s settings schedule
        assert sent, f"could not send within {BACK_WITHIN:g} s of the proxy's restart"
        assert wait_for(lambda: b"after" in got, max(1.0, deadline - time.monotonic())), (
            f"nothing received within {BACK_WITHIN:g} s after the proxy answered again")
    finally:
        consumer.shutdown()
        transport.close()
