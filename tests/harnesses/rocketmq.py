"""Harness: the RocketMQ transport against the real name server + broker of scripts/rocketmq.sh.

The broker runs with eighteen `1s` delay levels, so RECONSUME_LATER comes back in about a second.
Topics are created before any consumer starts (the C++ client learns routes only every 30 s), and
each group's `retryMaxTimes` is set to MAX_RECONSUME on the broker (the old client cannot carry
it), both through the transport's admin client (milliseconds, where `mqadmin` takes seconds).
Dead letters are read straight from `%DLQ%group`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumer_kit.core.errors import TransportUnavailable
from consumer_kit.testing.harness import (
    MAX_RECONSUME,
    unique,
    wait_for,
    wait_for_dead_letters,
)
from consumer_kit.transports import Delivery
from consumer_kit.transports.rocketmq import RocketMQTransport
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from tests import services

#: Must match the broker's messageDelayLevel (scripts/rocketmq.sh).
TEST_DELAY_LEVELS = (1.0,) * 18


class RocketMQHarness:
    timeout = 30.0
    quiet = 2.0

    def __init__(self, addr: str, tmp_path: Path) -> None:
        self.transport = RocketMQTransport(
            addr,
            producer_group=unique("ckit_test_producer"),
            delay_levels=TEST_DELAY_LEVELS,
            client_log_dir=str(tmp_path / "rocketmq-cpp"),
        )
        self.admin = self.transport.admin

    def topic(self, stem: str) -> str:
        name = unique(stem)
        self.admin.create_topic(name, queues=4)
        return name

    def group(self, stem: str) -> str:
        name = unique(stem)
        self.admin.prepare_group(name, retry_max_times=MAX_RECONSUME)
        return name

    def dead_letters(self, group: str, *, expect: int) -> list[Delivery]:
        return wait_for_dead_letters(lambda: self.transport.dead_letters(group), expect=expect,
                                     timeout=self.timeout, interval=0.25)

    def wait_balanced(self, group: str, consumers: int) -> bool:
        """Wait until every master broker lists `consumers` clients of `group`, then one second
        more for the earlier ones to act on the broker's notice and give queues up (a queue
        pulled by two clients meanwhile hands a message to both: at least once)."""
        def listed() -> bool:
            try:
                return all(len(self.admin.consumer_ids(addr, group)) == consumers
                           for addr in self.admin.master_brokers().values())
            except TransportUnavailable:
                return False

        if not wait_for(listed, self.timeout, interval=0.1):
            return False
        time.sleep(1.0)
        return True

    def wait_committed(self, group: str, topic: str) -> bool:
        """Wait until the broker holds `group`'s offsets past every message of `topic`."""
        return wait_committed(self.admin, group, topic, timeout=self.timeout)


def wait_committed(admin: RocketMQAdmin, group: str, topic: str, *, timeout: float) -> bool:
    """Wait up to `timeout` until the broker holds `group`'s offsets past every message of
    `topic` (proof that each of their callbacks returned).

    The C++ client commits offsets every 5 s, and at shutdown by a oneway request sent just
    before it closes its connections, which a loaded machine now and then loses (the restart
    then re-delivers: at least once, what the dedupe is for)."""
    def committed() -> bool:
        try:
            queues = admin.topic_queues(topic)
            return bool(queues) and all(admin.queue_lag(addr, topic, q, group=group) == 0
                                        for _, addr, q, _ in queues)
        except TransportUnavailable:  # a loaded broker late to answer: ask again
            return False

    return wait_for(committed, timeout, interval=0.25)


@contextmanager
def harness(tmp_path: Path) -> Iterator[RocketMQHarness]:
    services.require("rocketmq", services.ping_rocketmq)
    h = RocketMQHarness(services.rocketmq_addr(), tmp_path)
    try:
        yield h
    finally:
        h.transport.close()
