"""Running a transport consumer in the foreground: until stopped, or (burst) until drained."""

from __future__ import annotations

import logging
import threading
import time

from consumer_kit.core.errors import ConsumerStalled
from consumer_kit.core.stop_wait import wait_for_stop
from consumer_kit.transports.base import Consumer

log = logging.getLogger(__name__)

#: burst mode on transports that cannot count their backlog: stop after this long idle
DEFAULT_BURST_IDLE = 3.0
DEFAULT_POLL = 0.05
DEFAULT_SHUTDOWN_TIMEOUT = 10.0


def run_consumer(
    consumer: Consumer,
    stop: threading.Event,
    *,
    burst: bool = False,
    burst_idle: float = DEFAULT_BURST_IDLE,
    max_seconds: float | None = None,
    activity: Activity | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> int:
    """Start `consumer` and block until `stop` is set, `max_seconds` pass, or (with `burst`)
    nothing is left to deliver. Always shuts the consumer down, letting in-flight callbacks
    finish for up to `shutdown_timeout` seconds; returns how many were still running then
    (left behind: their messages are redelivered, their transactions not committed).

    Raises:
        ConsumerStalled: the consumer reported a `failure` (it was shut down first).
    """
    consumer.start()
    started = time.monotonic()
    activity = activity or Activity()
    quiet_since = time.monotonic()
    try:
        while not wait_for_stop(stop, DEFAULT_POLL):
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                break
            if consumer.failure is not None:
                break
            if not burst:
                continue
            ready = consumer.ready()
            busy = consumer.in_flight > 0
            if ready is not None:
                # when drained, confirm once more after a short pause: a callback may be about
                # to start
                if ready == 0 and not busy and (
                    wait_for_stop(stop, DEFAULT_POLL)
                    or (consumer.ready() == 0 and consumer.in_flight == 0)
                ):
                    break
                continue
            if busy or activity.since(quiet_since):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > burst_idle:
                break
    finally:
        consumer.shutdown(shutdown_timeout)
    if consumer.failure is not None:
        raise ConsumerStalled(consumer.failure)
    left = consumer.in_flight
    if left:
        log.warning("%d handler(s) still running after a %.0fs shutdown: left behind (their "
                    "messages will be redelivered)", left, shutdown_timeout)
    return left


class Activity:
    """Last time a callback ran (for burst mode on transports without a backlog count)."""

    def __init__(self) -> None:
        self.last = 0.0

    def touch(self) -> None:
        """Record that a message was handled now."""
        self.last = time.monotonic()

    def since(self, moment: float) -> bool:
        """True when a message was handled after `moment`."""
        return self.last > moment
