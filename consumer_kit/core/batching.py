"""`BatchWorker`: a daemon thread that hands queued items to a function in batches.

The after-commit dispatcher, the ack sender and the Redis writer all work this way: callers
submit without blocking, one thread drains the queue in batches, and `flush` waits until every
submitted item was handled.

The thread survives whatever `handle` raises (an `asyncio.CancelledError` or a gevent timeout
from a transport included: logged, the batch counted as handled). A worker started before
`os.fork` starts again in the child on its first `submit` (the parent's thread does not exist
there; its queue, locks and items are the parent's), saying so once. `close` keeps to its
timeout when the queue is full and the thread stuck.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from consumer_kit.core.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_QUEUE_SIZE = 100_000
#: every worker started in this process, reset in a forked child (`_after_fork`)
_STARTED: weakref.WeakSet[BatchWorker[object]] = weakref.WeakSet()


class _Stop:
    """The item that stops the one thread it was made for (another thread drops it)."""


class BatchWorker(Generic[T]):
    """Calls `handle(batch)` on its own thread with up to `max_batch` queued items.

    `linger` (seconds) waits that long for a batch to fill; 0 takes what is queued right now.
    An exception from `handle` is logged and the batch counts as handled. `after`, when given,
    runs on the thread after each batch counts as handled (`flush` does not wait for it):
    housekeeping that must not delay the items; an exception from it is logged.
    """

    def __init__(self, handle: Callable[[list[T]], None], *, name: str, max_batch: int = 100,
                 linger: float = 0.0, queue_size: int = DEFAULT_QUEUE_SIZE,
                 after: Callable[[], None] | None = None) -> None:
        for option, value in (("max_batch", max_batch), ("queue_size", queue_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                # (a queue.Queue of size 0 or less has no bound: the back-pressure is gone)
                raise ConfigError(f"{name}: {option} must be a whole number >= 1, not {value!r}")
        self.handle = handle
        self.after = after
        self.name = name
        self.max_batch = max_batch
        self.linger = linger
        self.queue_size = queue_size
        self.queue: queue.Queue[object] = queue.Queue(queue_size)
        self._pending = 0
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        # the running thread, and what stops it: a flag it looks at after each batch, and its
        # own stop item in the queue
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stop = _Stop()
        self._forked = False

    def start(self) -> BatchWorker[T]:
        """Start the thread (idempotent, and safe from several threads); returns self."""
        with self._lock:
            if self._thread is None:
                if self._forked:
                    log.warning("%s: started again in process %d, forked from the process "
                                "that started it", self.name, os.getpid())
                self._forked = False
                self._stopping, self._stop = threading.Event(), _Stop()
                self._thread = threading.Thread(target=self._run,
                                                args=(self._stopping, self._stop),
                                                name=self.name, daemon=True)
                self._thread.start()
                _STARTED.add(self)  # type: ignore[arg-type]
        return self

    @property
    def started(self) -> bool:
        """Whether a thread handles what is submitted: started and not closed (in a forked
        child, the parent's start counts: `submit` starts it again there)."""
        return self._thread is not None or self._forked

    def submit(self, item: T) -> bool:
        """Queue `item` without blocking; False (nothing queued) when the queue is full."""
        if self._forked:  # started in the parent: this process has no thread yet
            self.start()
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
        """Handle what is queued (up to `timeout`), then stop the thread; never longer than
        about twice `timeout`, even when the thread is stuck in `handle` with the queue full
        (it then stops after that batch, and what is still queued waits for a `start`)."""
        with self._lock:
            self._forked = False
            thread, stopping, stop = self._thread, self._stopping, self._stop
            if thread is None:
                return
            self.flush(timeout)
            stopping.set()
            with contextlib.suppress(queue.Full):  # else it stops after its batch
                self.queue.put(stop, timeout=timeout)
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s: still busy after %.0f s; stopped waiting with %d item(s) "
                            "not handled", self.name, timeout, self._pending)
            self._thread = None

    def _handled(self, n: int) -> None:
        with self._cond:
            self._pending -= n
            self._cond.notify_all()

    def _next(self, deadline: float) -> object:
        if self.linger <= 0:
            return self.queue.get_nowait()
        return self.queue.get(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, stopping: threading.Event, stop: _Stop) -> None:
        while not stopping.is_set():
            first = self.queue.get()
            if isinstance(first, _Stop):
                if first is stop:
                    return
                continue  # an earlier thread's, which stopped without it
            batch: list[T] = [first]  # type: ignore[list-item]
            deadline = time.monotonic() + self.linger
            while len(batch) < self.max_batch:
                try:
                    item = self._next(deadline)
                except queue.Empty:
                    break
                if isinstance(item, _Stop):
                    if item is stop:
                        stopping.set()
                        break
                    continue
                batch.append(item)  # type: ignore[arg-type]
            try:
                self.handle(batch)
            except BaseException as exc:  # the thread must survive any handler
                if isinstance(exc, SystemExit | KeyboardInterrupt | GeneratorExit):
                    raise
                log.exception("%s: batch of %d failed", self.name, len(batch))
            finally:
                self._handled(len(batch))
            if self.after is not None:
                try:
                    self.after()
                except BaseException as exc:  # housekeeping: the thread goes on, as after
                    if isinstance(exc, SystemExit | KeyboardInterrupt | GeneratorExit):
                        raise                 # a batch that failed
                    log.exception("%s: after a batch", self.name)


def _after_fork() -> None:
    """In a forked child: every worker started in the parent gets a fresh queue and condition
    (the parent's may be held by a thread that does not exist here) and starts on its first
    `submit`."""
    for worker in list(_STARTED):
        worker.queue = queue.Queue(worker.queue_size)
        worker._cond = threading.Condition()
        worker._lock = threading.Lock()
        worker._pending = 0
        worker._thread = None
        worker._forked = True
    _STARTED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
