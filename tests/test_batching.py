"""BatchWorker: batches, flush, survival of handler errors (a cancellation too), an `after`
housekeeping step flush does not wait for, a full queue refuses, close keeps to its timeout, a
forked child runs its own thread."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from consumer_kit.core.batching import BatchWorker
from consumer_kit.testing.harness import wait_for


def test_items_are_handled_in_batches_of_at_most_max_batch_and_flush_waits() -> None:
    gate = threading.Event()
    batches: list[list[int]] = []

    def handle(batch: list[int]) -> None:
        gate.wait(5)
        batches.append(batch)

    worker: BatchWorker[int] = BatchWorker(handle, name="t", max_batch=3).start()
    for i in range(7):
        assert worker.submit(i)
    assert not worker.flush(0.05)  # still held at the gate
    gate.set()
    assert worker.flush(5)
    assert [i for b in batches for i in b] == list(range(7))
    assert max(len(b) for b in batches) <= 3
    worker.close()


@pytest.mark.parametrize("error", [RuntimeError("boom"), asyncio.CancelledError()])
def test_a_failing_handler_does_not_stop_the_worker(
        error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler that raises once: a bug, or a BaseException (asyncio's cancellation,
    # gevent's Timeout) from a transport
    seen: list[int] = []

    def handle(batch: list[int]) -> None:
        if batch[0] == 0:
            raise error
        seen.extend(batch)

    worker: BatchWorker[int] = BatchWorker(handle, name="t", max_batch=1).start()
    worker.submit(0)
    worker.submit(1)
    # Then the thread lives on, and the failure is in the log
    assert worker.flush(5)
    assert seen == [1]
    assert "batch of 1 failed" in caplog.text
    worker.close()


@pytest.mark.parametrize("error", [RuntimeError("boom"), asyncio.CancelledError()])
def test_after_runs_once_each_batch_is_handled_and_its_failure_does_not_stop_the_worker(
        error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    # Given an `after` that holds until released the first time, then raises once
    release = threading.Event()
    calls: list[int] = []
    seen: list[int] = []

    def after() -> None:
        calls.append(1)
        if len(calls) == 1:
            release.wait(5)
        elif len(calls) == 2:
            raise error

    worker: BatchWorker[int] = BatchWorker(seen.extend, name="t", max_batch=1,
                                           after=after).start()
    # When a batch is handled, then flush does not wait for its `after`
    worker.submit(0)
    assert worker.flush(5) and seen == [0]
    release.set()
    # and an `after` that raises leaves the thread alive and says so
    worker.submit(1)
    worker.submit(2)
    assert worker.flush(5) and seen == [0, 1, 2]
    worker.close()
    assert len(calls) == 3 and "t: after a batch" in caplog.text


def test_a_full_queue_refuses_instead_of_blocking() -> None:
    worker: BatchWorker[int] = BatchWorker(lambda b: None, name="t", queue_size=1)  # not started
    assert worker.submit(1)
    assert not worker.submit(2)
    worker.start()
    assert worker.flush(5)
    worker.close()


def test_close_keeps_to_its_timeout_with_a_stuck_handler_and_a_full_queue() -> None:
    # Given a handler stuck on its batch and a full queue behind it
    release = threading.Event()
    worker: BatchWorker[int] = BatchWorker(lambda b: release.wait(30), name="t", max_batch=1,
                                           queue_size=2).start()
    for i in range(3):
        worker.submit(i)
    try:
        # When closed with a 0.5 s timeout
        started = time.monotonic()
        worker.close(0.5)
        # Then it returns in about twice that, not when the handler is released
        assert time.monotonic() - started < 3
    finally:
        release.set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_worker_started_before_a_fork_runs_again_in_the_child(tmp_path: Path) -> None:
    # Given a worker started in this process
    out = tmp_path / "child.txt"
    worker: BatchWorker[int] = BatchWorker(
        lambda b: out.write_text(",".join(map(str, b))), name="t").start()
    pid = os.fork()
    if pid == 0:  # the child: a submit there is handled by a thread of its own
        code = 1
        try:
            code = 0 if worker.submit(7) and worker.flush(5) else 3
        finally:
            os._exit(code)
    # Then the child handled its item
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.read_text() == "7"
    worker.close()


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_a_worker_closed_while_stuck_then_started_again_drains_the_rest_on_one_thread() -> None:
    # Given a handler stuck on its first batch, two items queued behind it, and a close that
    # gave up waiting
    entered, release = threading.Event(), threading.Event()
    handled: list[int] = []

    def handle(batch: list[int]) -> None:
        if batch == [0]:
            entered.set()
            release.wait(30)
        handled.extend(batch)

    worker: BatchWorker[int] = BatchWorker(handle, name="t-restart", max_batch=1,
                                           queue_size=2).start()
    assert worker.submit(0) and entered.wait(5)
    assert worker.submit(1) and worker.submit(2)
    worker.close(0.2)
    # When it is started again and the stuck batch ends
    worker.start()
    release.set()
    # Then every item was handled once, and one thread is left
    assert worker.flush(5)
    assert sorted(handled) == [0, 1, 2]
    assert wait_for(lambda: len(_threads("t-restart")) == 1, 5)
    worker.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_concurrent_first_submits_in_a_forked_child_start_one_thread() -> None:
    worker: BatchWorker[int] = BatchWorker(lambda b: time.sleep(0.001), name="t-forked",
                                           max_batch=10).start()
    worst = 0
    for _ in range(10):  # a race: tried in ten children
        pid = os.fork()
        if pid == 0:  # eight threads submit at once, switching as often as can be
            code = 100
            try:
                sys.setswitchinterval(1e-6)
                go = threading.Barrier(8)

                def submit_many(go: threading.Barrier = go) -> None:
                    go.wait()
                    for i in range(50):
                        worker.submit(i)

                threads = [threading.Thread(target=submit_many) for _ in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                code = len(_threads("t-forked")) if worker.flush(5) else 99
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        worst = max(worst, os.waitstatus_to_exitcode(status))
    assert worst == 1
    worker.close()
