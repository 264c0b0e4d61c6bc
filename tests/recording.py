"""A transport wrapper that records every send (to prove exactly-once delivery to the broker)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

from consumer_kit.core.errors import TransportUnavailable
from consumer_kit.core.messages import (
    Delivery,
    DeliveryCallback,
    OutgoingMessage,
    SendResult,
    Subscription,
)
from consumer_kit.transports.base import Consumer, Transport
from consumer_kit.transports.memory import MemoryTransport


class RecordingTransport(Transport):
    """Wraps a transport; counts sends per `ckit_id`; can be told to fail the next N sends."""

    scheme = "recording"

    def __init__(self, inner: Transport | None = None) -> None:
        self.inner = inner or MemoryTransport()
        self.max_body_bytes = self.inner.max_body_bytes
        self.sent: list[OutgoingMessage] = []
        self.lock = threading.Lock()
        self.fail_next = 0

    def send(self, message: OutgoingMessage) -> SendResult:
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                raise TransportUnavailable("broker down (simulated)")
        result = self.inner.send(message)
        with self.lock:
            self.sent.append(message)
        return result

    def consumer(self, group: str, subscriptions: Sequence[Subscription],
                 callback: DeliveryCallback, *, threads: int = 1) -> Consumer:
        return self.inner.consumer(group, subscriptions, callback, threads=threads)

    def dead_letters(self, group: str) -> list[Delivery]:
        return self.inner.dead_letters(group)

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(m.properties["ckit_id"] for m in self.sent)


class HeldTransport(RecordingTransport):
    """Blocks the send of `hold` (a message id) until `release` is set."""

    def __init__(self, hold: str, seconds: float = 30.0) -> None:
        super().__init__()
        self.hold, self.seconds = hold, seconds
        self.holding = threading.Event()
        self.release = threading.Event()

    def send(self, message: OutgoingMessage) -> SendResult:
        if message.properties["ckit_id"] == self.hold and not self.release.is_set():
            self.holding.set()
            self.release.wait(self.seconds)
        return super().send(message)


class SlowTransport(RecordingTransport):
    """Each send takes `seconds`; `started` holds the `time.monotonic()` each send began at."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.started: list[float] = []

    def send(self, message: OutgoingMessage) -> SendResult:
        self.started.append(time.monotonic())
        time.sleep(self.seconds)
        return super().send(message)
