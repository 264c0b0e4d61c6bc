"""Which queues a RocketMQ consumer owns (as the C++ client allocates them), for the liveness
watchdog; and the bounded exit of `ckit consume` when a native shutdown does not return."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from consumer_kit.transports.rocketmq.liveness import Backlog, allocate_averagely


def fake_consumer(group: str, *, admin: Any = None, stall_after: float = 60) -> Any:
    """A RocketMQConsumer on a stand-in transport (no broker, no librocketmq): its watchdog and
    rebuild logic alone."""
    import types

    from consumer_kit.core.messages import Subscription
    from consumer_kit.transports.rocketmq.consumer import RocketMQConsumer

    host = types.SimpleNamespace(admin=admin, stall_after=stall_after, max_rebuilds=2,
                                 send_back_patience=1.0, ordered_topics=frozenset())
    return RocketMQConsumer(host, group, [Subscription("T")],  # type: ignore[arg-type]
                            lambda d: None, threads=1)  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(("queues", "clients", "expected"), [
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (4, 4, [[0], [1], [2], [3]]),
    (2, 3, [[0], [1], []]),
    (5, 2, [[0, 1, 2], [3, 4]]),
    (1, 1, [[0]]),
])
def test_queues_are_shared_out_like_allocate_message_queue_averagely(
        queues: int, clients: int, expected: list[list[int]]) -> None:
    ids = [f"1-127.0.0.1@c{n}" for n in range(clients)]
    assert [allocate_averagely(list(range(queues)), ids, cid) for cid in ids] == expected


def test_every_queue_has_exactly_one_owner() -> None:
    for n_queues in range(1, 12):
        for n_clients in range(1, 6):
            ids = [f"c{n}" for n in range(n_clients)]
            owned = [q for cid in ids for q in allocate_averagely(list(range(n_queues)), ids, cid)]
            assert sorted(owned) == list(range(n_queues))


def test_a_consumer_the_broker_does_not_list_owns_nothing() -> None:
    assert allocate_averagely([0, 1], ["a", "b"], "c") == []


@pytest.mark.parametrize(("backlog", "stalled"), [
    (Backlog(owned=3, total=3, registered=True), True),
    (Backlog(owned=0, total=9, registered=True), False),  # its peers own the backlog
    (Backlog(owned=0, total=9, registered=False), True),  # the broker lost its heartbeats
    (Backlog(owned=0, total=0, registered=False), False),
])
def test_an_idle_consumer_has_stalled_only_when_a_backlog_waits_for_it(
        backlog: Backlog, stalled: bool) -> None:
    assert backlog.stalled_if_idle is stalled


def test_a_native_shutdown_that_never_returns_does_not_keep_the_process_up() -> None:
    # Given a process whose "native shutdown" thread never ends (and is not a daemon)
    code = (
        "import threading, time\n"
        "from consumer_kit.cli.runtime import exit_if_native_shutdown_hangs\n"
        "threading.Thread(target=time.sleep, args=(600,), name='ckit-rmq-stop-g').start()\n"
        "exit_if_native_shutdown_hangs(3)\n"
    )
    began = time.monotonic()
    # When it ends
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    # Then it exits at once with the code asked for, saying why
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - began < 30
    assert "native consumer shutdown did not return" in result.stderr


class _RefusingAdmin:
    """A broker that answers but refuses the watchdog's backlog query; or one that is away."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def topic_queues(self, topic: str) -> list[tuple[str, str, int, int]]:
        self.calls += 1
        raise self.error


@pytest.mark.parametrize(("error", "warnings"), [
    ("refused", 1),      # it answered and refused: say once that the watchdog is blind
    ("unavailable", 0),  # it is away: the client reconnects by itself, nothing to say
])
def test_a_watchdog_the_broker_refuses_warns_once_and_one_it_cannot_reach_stays_quiet(
        error: str, warnings: int, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import threading

    from consumer_kit.core.errors import TransportError, TransportUnavailable

    exc = (TransportError("CODE 1: query refused") if error == "refused"
           else TransportUnavailable("connect refused"))
    admin = _RefusingAdmin(exc)
    consumer = fake_consumer("g_watch", admin=admin, stall_after=0.2)
    consumer._last_message = time.monotonic() - 60  # idle far longer than stall_after
    caplog.set_level(logging.DEBUG, logger="consumer_kit")
    watcher = threading.Thread(target=consumer._watch)
    watcher.start()
    deadline = time.monotonic() + 10
    while admin.calls < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer._stopping.set()
    watcher.join(5)
    assert admin.calls >= 4
    said = [r for r in caplog.records if "liveness check" in r.getMessage()]
    assert [r.levelname for r in said].count("WARNING") == warnings
    assert consumer.failure is None and consumer.rebuilds == 0


class _FakePush:
    def __init__(self, name: str) -> None:
        self.name = name
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_shutdown_during_a_rebuild_stops_the_new_native_consumer_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from consumer_kit.transports.rocketmq import consumer as rmq_consumer

    # Given: a consumer whose watchdog is rebuilding it: the old native consumer is stopped,
    # the new one is still starting
    monkeypatch.setattr(rmq_consumer.native, "destroy_push_consumer", lambda push: None)
    consumer = fake_consumer("g_swap")
    old, new = _FakePush("old"), _FakePush("new")
    consumer._push = old
    starting, go_on = threading.Event(), threading.Event()

    def slow_start() -> _FakePush:
        starting.set()
        assert go_on.wait(10)
        return new

    monkeypatch.setattr(consumer, "_start_push", slow_start)
    rebuild = threading.Thread(target=consumer._rebuild)
    rebuild.start()
    assert starting.wait(10)
    # When: the process is told to stop meanwhile
    stopper = threading.Thread(target=consumer.shutdown, kwargs={"timeout": 5})
    stopper.start()
    time.sleep(0.3)
    go_on.set()
    rebuild.join(10)
    stopper.join(10)
    # Then: each native consumer was stopped exactly once; none is left running
    assert (old.shutdowns, new.shutdowns) == (1, 1)
    assert consumer._push is None and consumer.rebuilds == 1


@pytest.mark.parametrize("stall_after", [0.5, 3.0, 9.9])
def test_a_stall_limit_shorter_than_two_offset_commits_is_refused_before_anything_starts(
        stall_after: float) -> None:
    # Given: a watchdog that would fire before the client commits its last offsets (every 5 s),
    # taking a healthy idle consumer for a stalled one
    from consumer_kit.core.errors import ConfigError
    from consumer_kit.transports.rocketmq import RocketMQTransport

    # When / Then: one line that says why and what to use instead
    with pytest.raises(ConfigError, match=r"below 10 s: .* every 5 s") as caught:
        RocketMQTransport("127.0.0.1:9876", stall_after=stall_after)
    assert "use 0 to turn the watchdog off" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("stall_after", [0.0, 10.0, 60.0])
def test_the_watchdog_can_be_off_or_at_least_two_offset_commits(stall_after: float) -> None:
    from consumer_kit.transports.rocketmq import RocketMQTransport

    transport = RocketMQTransport("127.0.0.1:9876", stall_after=stall_after)
    try:
        assert transport.stall_after == stall_after
    finally:
        transport.close()


def test_a_watchdog_does_not_rebuild_a_consumer_that_received_a_message_during_its_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from consumer_kit.transports.rocketmq import consumer as rmq_consumer

    # Given an idle consumer whose backlog query sees a lag of 1: a message that arrived (and
    # was handled) while the broker was being asked, its offset not committed yet
    consumer = fake_consumer("g_recheck", stall_after=0.2)
    consumer._last_message = time.monotonic() - 60
    asked = threading.Event()

    def backlog(*_args: Any) -> Backlog:
        consumer._last_message = time.monotonic()  # the message's callback returned meanwhile
        asked.set()
        return Backlog(owned=1, total=1, registered=True)

    monkeypatch.setattr(rmq_consumer, "owned_backlog", backlog)
    rebuilds: list[int] = []
    monkeypatch.setattr(consumer, "_rebuild", lambda: rebuilds.append(1))
    watcher = threading.Thread(target=consumer._watch)
    # When the watchdog looks
    watcher.start()
    assert asked.wait(10)
    time.sleep(0.1)
    consumer._stopping.set()
    watcher.join(5)
    # Then it left the consumer alone
    assert rebuilds == [] and consumer.failure is None


def test_a_rebuild_that_fails_in_any_way_ends_the_consumer_instead_of_leaving_it_dead(
        monkeypatch: pytest.MonkeyPatch) -> None:

    from consumer_kit.transports.rocketmq import consumer as rmq_consumer

    # Given a consumer whose new native consumer cannot be built (not a TransportError)
    monkeypatch.setattr(rmq_consumer.native, "destroy_push_consumer", lambda push: None)
    consumer = fake_consumer("g_rebuild")
    consumer._push = _FakePush("old")

    def broken() -> Any:
        raise OSError("cannot open the client log folder")

    monkeypatch.setattr(consumer, "_start_push", broken)
    # When the watchdog rebuilds it
    consumer._rebuild()
    # Then the failure is recorded (ckit consume exits 3) and the old consumer is not kept
    assert consumer.failure is not None and "cannot open the client log folder" in consumer.failure
    assert consumer._push is None


@pytest.mark.parametrize("kind", ["rocketmq", "rocketmq5"])
def test_a_consumer_mixing_ordered_and_unordered_topics_is_refused(kind: str) -> None:
    import types

    from consumer_kit.core.errors import ConfigError
    from consumer_kit.core.messages import Subscription

    host = types.SimpleNamespace(admin=None, stall_after=60, max_rebuilds=2,
                                 send_back_patience=1.0, ordered_topics=frozenset({"ORDERED"}),
                                 invisible_seconds=30.0, retry_delays=(1.0,), await_seconds=1.0,
                                 thread_count=None)
    subs = [Subscription("ORDERED"), Subscription("PLAIN")]
    with pytest.raises(ConfigError, match=r"mixes ordered topics \(ORDERED\) with unordered "
                                          r"ones \(PLAIN\)"):
        if kind == "rocketmq":
            from consumer_kit.transports.rocketmq.consumer import RocketMQConsumer
            RocketMQConsumer(host, "g_mixed", subs, lambda d: None, threads=1)  # type: ignore[arg-type,return-value]
        else:
            from consumer_kit.transports.rocketmq5.consumer import RocketMQ5Consumer
            RocketMQ5Consumer(host, "g_mixed", subs, lambda d: None, threads=1)  # type: ignore[arg-type,return-value]
