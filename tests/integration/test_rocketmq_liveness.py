"""The RocketMQ consumer's liveness watchdog on a real broker: a native consumer that stops
pulling while its queues hold messages is rebuilt, and after `max_rebuilds` the run ends with
`ConsumerStalled` (so that `ckit consume` exits 3 for its supervisor).

The stall is the one seen after a broker restart (the 2.0.0 native client drops its pull
requests while the process stays up), produced here by shutting the native consumer down
behind the wrapper's back: the wrapper still believes it runs, nothing is pulled.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from consumer_kit.core.errors import ConsumerStalled
from consumer_kit.core.messages import OutgoingMessage, Subscription
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery
from consumer_kit.transports.rocketmq import RocketMQTransport
from consumer_kit.transports.rocketmq.consumer import RocketMQConsumer
from consumer_kit.transports.rocketmq.liveness import MIN_STALL_AFTER, STALLS, owned_backlog
from consumer_kit.transports.running import run_consumer
from tests import services
from tests.harnesses.rocketmq import wait_committed

pytestmark = [pytest.mark.rocketmq, pytest.mark.slow]

#: the least the transport accepts: twice the C++ client's 5 s offset commit interval
STALL_AFTER = MIN_STALL_AFTER


@pytest.fixture
def transport() -> Iterator[RocketMQTransport]:
    services.require("rocketmq", services.ping_rocketmq)
    t = RocketMQTransport(services.rocketmq_addr(), create_topics=True,
                          stall_after=STALL_AFTER, max_rebuilds=1)
    yield t
    t.close()


def silence(consumer: RocketMQConsumer) -> None:
    """Stop the native consumer under the wrapper: it pulls nothing from now on."""
    push = consumer._push
    assert push is not None
    push.shutdown()


def stalls(group: str, action: str) -> float:
    return STALLS.labels(group, action)._value.get()


def new_consumer(transport: RocketMQTransport, callback: Callable[[Delivery], ConsumeStatus],
                 *, threads: int = 1) -> tuple[RocketMQConsumer, str, str]:
    """A consumer (not started) of a new topic and group: (consumer, topic, group)."""
    tag = uuid.uuid4().hex[:8]
    topic, group = f"ckit_live_{tag}", f"live_{tag}"
    transport.ensure_topic(topic)
    consumer = transport.consumer(group, [Subscription(topic, "*")], callback, threads=threads)
    assert isinstance(consumer, RocketMQConsumer)
    return consumer, topic, group


def test_a_consumer_that_stops_pulling_is_rebuilt_and_receives_the_backlog(
        transport: RocketMQTransport) -> None:
    # Given a running consumer that received a first message
    got: list[bytes] = []

    def callback(d: Delivery) -> ConsumeStatus:
        got.append(d.body)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, topic, group = new_consumer(transport, callback, threads=2)
    consumer.start()
    try:
        transport.send(OutgoingMessage(topic, b"first"))
        assert wait_for(lambda: got == [b"first"], 30)
        # (committed by the periodic commit, not the oneway one of the shutdown below, which a
        # loaded machine may lose: the rebuilt consumer would get "first" again)
        assert wait_committed(transport.admin, group, topic, timeout=30)
        # When its native client silently stops pulling and messages keep coming
        silence(consumer)
        for n in range(5):
            transport.send(OutgoingMessage(topic, b"after-%d" % n))
        # Then the watchdog rebuilds it and every message arrives, counted as one rebuild
        assert wait_for(lambda: len(got) == 6, STALL_AFTER + 60), got
        assert sorted(got[1:]) == [b"after-%d" % n for n in range(5)]
        assert consumer.rebuilds == 1
        assert stalls(group, "rebuild") == 1
        assert consumer.failure is None
    finally:
        consumer.shutdown()


def test_a_quiet_consumer_without_a_backlog_is_not_rebuilt(
        transport: RocketMQTransport) -> None:
    # Given a consumer with nothing to receive
    consumer, topic, group = new_consumer(transport, lambda d: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    try:
        # When it stays idle for twice the stall limit (the watchdog looks every 2.5 s)
        time.sleep(STALL_AFTER * 2)
        # Then it is left alone: the broker lists it and its queues hold nothing
        backlog = owned_backlog(transport.admin, group, [topic], consumer.instance_name)
        assert (backlog.registered, backlog.owned) == (True, 0)
        assert consumer.rebuilds == 0
        assert stalls(group, "rebuild") == 0
    finally:
        consumer.shutdown()


def test_a_healthy_consumer_idle_after_a_slow_message_is_not_rebuilt(
        transport: RocketMQTransport) -> None:
    # Given a consumer whose one message took 9 s, longer than the client's 5 s offset commit
    # interval (the broker counts it as a backlog until the commit after the handler returned,
    # which a watchdog counting idleness from the callback's start would not wait for)
    done = threading.Event()

    def slow(d: Delivery) -> ConsumeStatus:
        time.sleep(9)
        done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, topic, group = new_consumer(transport, slow)
    consumer.start()
    try:
        # (sent 2 s in: the client commits at 5 s steps from its start, so the handler returns
        # at about 11 s and its offset waits until 15 s, past the watchdog's look at 12.5 s)
        time.sleep(2)
        transport.send(OutgoingMessage(topic, b"slow"))
        assert done.wait(30)
        # When it stays idle for twice the stall limit after the handler returned
        time.sleep(STALL_AFTER * 2)
        # Then it was never taken for a stalled consumer: its offset was committed in between
        assert wait_committed(transport.admin, group, topic, timeout=1)
        assert consumer.rebuilds == 0
        assert stalls(group, "rebuild") == 0
    finally:
        consumer.shutdown()


def test_a_consumer_still_stalled_after_its_rebuilds_ends_the_run_with_consumer_stalled(
        transport: RocketMQTransport) -> None:
    # Given a consumer whose every native client stops pulling at once (max_rebuilds=1)
    consumer, topic, group = new_consumer(transport, lambda d: ConsumeStatus.RECONSUME_LATER)
    for n in range(3):
        transport.send(OutgoingMessage(topic, b"m%d" % n))
    original = consumer._start_push

    def start_silent() -> object:
        push = original()
        push.shutdown()
        return push

    consumer._start_push = start_silent  # type: ignore[method-assign]
    stop = threading.Event()
    began = time.monotonic()
    # When it runs
    with pytest.raises(ConsumerStalled) as exc:
        run_consumer(consumer, stop, max_seconds=STALL_AFTER * 10 + 60)
    # Then the run ends after one rebuild, with one line that says why, counted
    assert time.monotonic() - began < STALL_AFTER * 10 + 30
    assert "after 1 rebuild(s)" in str(exc.value) and "\n" not in str(exc.value)
    assert (stalls(group, "rebuild"), stalls(group, "exit")) == (1, 1)
