"""`BatchWorker`: a daemon thread that hands queued items to a function in batches.

The after-commit dispatcher, the ack sender and the Redis writer all work this way: callers
submit without blocking, one thread drains the queue in batches, and `flush` waits until every
submitted item was handled.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_QUEUE_SIZE = 100_000
_STOP = object()


class BatchWorker(Generic[T]):
    """Calls `handle(batch)` on its own thread with up to `max_batch` queued items.

    `linger` (seconds) waits that long for a batch to fill; 0 takes what is queued right now.
    An exception from `handle` is logged and the batch counts as handled.
    """

    def __init__(self, handle: Callable[[list[T]], None], *, name: str, max_batch: int = 100,
                 linger: float = 0.0, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.handle = handle
        self.name = name
        self.max_batch = max_batch
        self.linger = linger
        self.queue: queue.Queue[object] = queue.Queue(queue_size)
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self) -> BatchWorker[T]:
        """Start the thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def submit(self, item: T) -> bool:
        """Queue `item` without blocking; False (nothing queued) when the queue is full."""
        with self._cond:
            self._pending += 1
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self._handled(1)
            return False
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted item was handled; True when that happened in time."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Handle what is queued (up to `timeout`), then stop the thread."""
        if self._thread is None:
            return
        self.flush(timeout)
        self.queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def _handled(self, n: int) -> None:
        with self._cond:
            self._pending -= n
            self._cond.notify_all()

    def _next(self, deadline: float) -> object:
        if self.linger <= 0:
            return self.queue.get_nowait()
        return self.queue.get(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is _STOP:
                return
            batch: list[T] = [first]  # type: ignore[list-item]
            deadline = time.monotonic() + self.linger
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._next(deadline)
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)  # type: ignore[arg-type]
            try:
                self.handle(batch)
            except Exception:  # the thread must survive any handler bug
                log.exception("%s: batch of %d failed", self.name, len(batch))
            finally:
                self._handled(len(batch))
            if stop:
                return
