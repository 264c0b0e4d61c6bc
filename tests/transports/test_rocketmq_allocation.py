"""Which queues a RocketMQ consumer owns (as the C++ client allocates them), for the liveness
watchdog; and the bounded exit of `ckit consume` when a native shutdown does not return."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from consumer_kit.transports.rocketmq.liveness import Backlog, allocate_averagely


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
