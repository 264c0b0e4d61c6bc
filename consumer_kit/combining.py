"""`Combiner`: concurrent blocking calls share one batched call (flat combining).

A consume thread that must wait for a network round trip anyway lets the threads that arrive
meanwhile ride along: the first caller becomes the leader and sends everything queued in one
batch; callers that arrive while it is out queue up and the next of them leads the next batch.
With one thread this is a plain call; with N threads in flight it takes about one round trip
per N calls. No thread of its own and no timer: nobody waits for a batch to fill.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_BATCH = 128


class _Slot(Generic[T, R]):
    __slots__ = ("answered", "error", "item", "result", "wake")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.answered = False
        # held from the start; released once to wake the waiting caller (cheaper than an Event)
        self.wake = threading.Lock()
        self.wake.acquire()


class Combiner(Generic[T, R]):
    """Calls `send(items)` (which returns one result per item, in order) for batches of
    concurrent `call(item)`s. An exception from `send` is raised in every caller of that batch.
    """

    def __init__(self, send: Callable[[Sequence[T]], Sequence[R]], *,
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.send = send
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._leading = False
        #: batches sent and items in them (for metrics and the benchmark)
        self.batches = 0
        self.items = 0

    def call(self, item: T) -> R:
        """Return `send`'s result for `item`, sent alone or with concurrent callers' items."""
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._queue.append(slot)
            lead = not self._leading
            self._leading = True
        if not lead:
            slot.wake.acquire()
        if not slot.answered:  # we lead (woken unanswered: handed the lead); our slot is first
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _lead(self) -> None:
        with self._lock:
            batch = self._queue[:self.max_batch]
            del self._queue[:self.max_batch]
        try:
            results = self.send([slot.item for slot in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"send returned {len(results)} results for {len(batch)} items")
            for slot, result in zip(batch, results):
                slot.result = result
        except BaseException as exc:  # every caller of the batch sees the failure
            for slot in batch:
                slot.error = exc
        with self._lock:
            self.batches += 1
            self.items += len(batch)
            if self._queue:  # hand the lead to the oldest waiter: it sends the next batch
                self._queue[0].wake.release()
            else:
                self._leading = False
        for slot in batch:
            slot.answered = True
            if slot.wake.locked():
                slot.wake.release()
