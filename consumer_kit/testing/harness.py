"""What the transport conformance suite needs from each backend's test harness."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Protocol

from consumer_kit.core.messages import Delivery
from consumer_kit.transports.base import Transport

_counter = itertools.count()


def unique(stem: str) -> str:
    """A topic or group name unique to this test run (brokers keep state between tests)."""
    return f"{stem}_{os.getpid()}_{int(time.time() * 1000) % 10_000_000}_{next(_counter)}"


class Harness(Protocol):
    """A transport configured for fast tests: retry back-off of about a second or less and
    `max_reconsume_times = MAX_RECONSUME` (2).

    A harness whose transport commits consumed offsets later than each ack (RocketMQ's push
    consumer) also defines `wait_committed(group, topic) -> bool`: wait until the broker holds
    the group's offsets past every message of the topic. The restart test calls it when present.
    One whose transport shares queues out among a group's consumers by rebalancing also defines
    `wait_balanced(group, consumers) -> bool`: wait until that many consumers hold their share.
    """

    transport: Transport
    #: how long to wait for a delivery that must come
    timeout: float
    #: how long to watch for a delivery that must NOT come
    quiet: float

    def topic(self, stem: str) -> str:
        """A fresh topic, created on the broker when the backend needs that."""

    def group(self, stem: str) -> str:
        """A fresh consumer group name, configured on the broker when the backend needs that."""

    def dead_letters(self, group: str, *, expect: int) -> list[Delivery]:
        """Messages that went to `%DLQ%group`, waiting up to `timeout` for `expect` of them."""


MAX_RECONSUME = 2


def wait_for(predicate: Callable[[], bool], timeout: float, *, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is true or `timeout` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_for_dead_letters(read: Callable[[], list[Delivery]], *, expect: int, timeout: float,
                          interval: float = 0.02) -> list[Delivery]:
    """Call `read` (a transport's `dead_letters(group)`) until it returns `expect` messages or
    `timeout` passes; return its last answer (one read per poll)."""
    found: list[Delivery] = []

    def enough() -> bool:
        found[:] = read()
        return len(found) >= expect

    wait_for(enough, timeout, interval=interval)
    return found
