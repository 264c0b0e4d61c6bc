"""BatchWorker: batches, flush, survival of handler errors (a cancellation too), a full queue
refuses, close keeps to its timeout, a forked child runs its own thread."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from consumer_kit.core.batching import BatchWorker


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
