"""The loops that run on the main thread (`run_consumer`, a one-worker relay, its rate cap)
wait for their stop event without ever taking its lock there, so a signal handler that sets
the event itself (`stop.set()`, `Relay.stop()`) cannot wait for a lock its own thread holds."""

from __future__ import annotations

import threading
import time
from typing import Any

from consumer_kit.core.errors import TransportUnavailable
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    SendResult,
    Subscription,
)
from consumer_kit.core.stop_wait import TICK, wait_for_stop
from consumer_kit.transports.memory import MemoryTransport
from consumer_kit.transports.running import run_consumer
from outbox_producer import Outbox, Relay
from outbox_producer.relay import RateLimiter
from tests.conftest import Db
from tests.recording import RecordingTransport


class MainThreadLock:
    """A lock that counts how often the main thread takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.main_takes = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread() is threading.main_thread():
            self.main_takes += 1
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: Any) -> None:
        self.release()


def watched(event: threading.Event) -> MainThreadLock:
    """Put a counting lock under `event` (what `Event.wait` and `Event.set` take)."""
    lock = MainThreadLock()
    event._cond = threading.Condition(lock)  # type: ignore[attr-defined]
    return lock


def set_later(action: Any, after: float) -> threading.Timer:
    timer = threading.Timer(after, action)
    timer.start()
    return timer


def test_a_consumer_run_waits_for_its_stop_without_taking_the_event_lock_on_the_main_thread(
) -> None:
    # Given a consumer run on the main thread, its stop event watched
    transport = MemoryTransport()
    transport.send(OutgoingMessage("T", b"x"))
    consumer = transport.consumer("g", [Subscription("T")],
                                  lambda _d: ConsumeStatus.CONSUME_SUCCESS)
    stop = threading.Event()
    lock = watched(stop)
    # When another thread sets it a moment later
    set_later(stop.set, 0.4)
    started = time.monotonic()
    run_consumer(consumer, stop)
    # Then the run ended soon after, and the main thread never took the event's lock
    assert time.monotonic() - started < 3
    assert lock.main_takes == 0


def test_a_burst_run_checks_its_drained_queue_without_taking_the_event_lock() -> None:
    # Given a burst run with messages to drain
    transport = MemoryTransport()
    for i in range(5):
        transport.send(OutgoingMessage("T", str(i).encode()))
    seen: list[Delivery] = []
    consumer = transport.consumer("g", [Subscription("T")],
                                  lambda d: seen.append(d) or ConsumeStatus.CONSUME_SUCCESS)
    stop = threading.Event()
    lock = watched(stop)
    # When it runs until drained
    run_consumer(consumer, stop, burst=True, max_seconds=10)
    # Then it drained them all, never taking the lock on the main thread
    assert len(seen) == 5 and lock.main_takes == 0


def test_an_idle_relay_waits_for_stop_without_taking_the_event_lock(sqlite_db: Db) -> None:
    # Given a relay with nothing due, run on the main thread, its stop event watched
    relay = Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox,
                  idle_sleep=5.0)
    lock = watched(relay.stopping)
    # When it is stopped from another thread during its idle sleep
    set_later(relay.stop, 0.4)
    started = time.monotonic()
    relay.run()
    # Then it returned at once, not after the idle sleep, and without taking the lock
    assert time.monotonic() - started < 2
    assert lock.main_takes == 0


class DownTransport(RecordingTransport):
    def send(self, message: OutgoingMessage) -> SendResult:
        raise TransportUnavailable("broker down (simulated)")


def test_a_relay_waiting_out_an_outage_stops_without_taking_the_event_lock(
        sqlite_db: Db) -> None:
    # Given a row due and a broker that is down
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    with sqlite_db.engine.begin() as conn:
        outbox.publish(conn, "T", {"i": 1}, biz_type="t", biz_key="1")
    relay = Relay(sqlite_db.engine, DownTransport(), table=sqlite_db.names.outbox)
    lock = watched(relay.stopping)
    # When it is stopped while waiting out the outage
    set_later(relay.stop, 0.6)
    result = relay.run()
    # Then it counted the outage and stopped, without taking the lock on the main thread
    assert result.errors >= 1 and lock.main_takes == 0


def test_the_rate_cap_waits_for_its_slot_without_taking_the_event_lock() -> None:
    # Given a cap of 2 sends a second, its first slot taken
    limiter = RateLimiter(2.0)
    stop = threading.Event()
    lock = watched(stop)
    assert limiter.acquire(stop)
    # When the next slot is waited for, and then one after stop was set from another thread
    assert limiter.acquire(stop)
    set_later(stop.set, 0.1)
    started = time.monotonic()
    # Then the wait for the third slot ends at the stop, and no wait took the lock
    assert limiter.acquire(stop) is False
    assert time.monotonic() - started < 0.45
    assert lock.main_takes == 0


def test_waiting_for_stop_returns_within_a_tick_of_it_being_set_and_false_on_timeout() -> None:
    stop = threading.Event()
    started = time.monotonic()
    assert wait_for_stop(stop, 0.2) is False
    assert time.monotonic() - started >= 0.2
    set_later(stop.set, 0.1)
    started = time.monotonic()
    assert wait_for_stop(stop, 5.0) is True
    assert time.monotonic() - started < 0.1 + TICK + 0.5


def test_waiting_for_stop_off_the_main_thread_is_the_event_wait() -> None:
    # Off the main thread no signal handler runs: the event's own wait (woken at once) is used
    stop = threading.Event()
    lock = watched(stop)
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(wait_for_stop(stop, 0.05)))
    thread.start()
    thread.join()
    assert answers == [False] and lock.main_takes == 0
    assert lock.acquire(blocking=False)  # nobody left it held
    lock.release()
