"""BatchWorker: batches, flush, survival of handler errors, a full queue refuses."""

from __future__ import annotations

import threading

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


def test_a_failing_handler_does_not_stop_the_worker() -> None:
    seen: list[int] = []

    def handle(batch: list[int]) -> None:
        if batch[0] == 0:
            raise RuntimeError("boom")
        seen.extend(batch)

    worker: BatchWorker[int] = BatchWorker(handle, name="t", max_batch=1).start()
    worker.submit(0)
    worker.submit(1)
    assert worker.flush(5)
    assert seen == [1]
    worker.close()


def test_a_full_queue_refuses_instead_of_blocking() -> None:
    worker: BatchWorker[int] = BatchWorker(lambda b: None, name="t", queue_size=1)  # not started
    assert worker.submit(1)
    assert not worker.submit(2)
    worker.start()
    assert worker.flush(5)
    worker.close()
