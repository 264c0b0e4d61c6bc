"""`Combiner`: concurrent blocking calls share one batched call (flat combining).

A consume thread that must wait for a network round trip anyway lets the threads that arrive
meanwhile ride along: the first caller becomes the leader and sends everything queued in one
batch; callers that arrive while it is out queue up and the oldest of them leads the next batch.
With one thread this is a plain call; with N threads in flight it takes about one round trip
per N calls. No thread of its own and no timer: nobody waits for a batch to fill.

Because every caller may wait on one `send`, `send` must be bounded in time (for Redis: a
client with `socket_timeout`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from consumer_kit.core.errors import CkitError, ConfigError

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_BATCH = 128


class CombinedSendError(CkitError):
    """Raised in the callers whose items rode in another thread's failed `send`; the
    original exception is its `__cause__` (the leader that ran `send` gets the original)."""


class _Slot(Generic[T, R]):
    __slots__ = ("answered", "error", "handed", "item", "result", "wake")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.answered = False
        self.handed = False  # given the lead: its thread sends the next batch
        # held from the start; released exactly once to wake the waiting caller
        self.wake = threading.Lock()
        self.wake.acquire()


class Combiner(Generic[T, R]):
    """Calls `send(items)` (which returns one result per item, in order) for batches of
    concurrent `call(item)`s; `send` never runs twice at once.

    When `send` raises, its caller (the leader) gets that exception and every other caller of
    the batch a `CombinedSendError` chained to it. A caller interrupted while it waits (a
    signal handler raising in the main thread) leaves cleanly: its item is dropped or, if it
    was already being sent, its answer discarded, and the lead passes on. A handler that raises
    again during that clean-up, or while a leader on the main thread waits for the short lock
    of its own hand-off, leaves the combiner leading with nobody sending (Python code cannot
    be made safe against exceptions raised between any two bytecodes): keep the main thread
    out of a combiner other threads depend on, as `RedisDedupe.claim` does.
    """

    def __init__(self, send: Callable[[Sequence[T]], Sequence[R]], *,
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if max_batch < 1:
            raise ConfigError("max_batch must be at least 1")
        self.send = send
        self.max_batch = max_batch
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._leading = False
        #: batches sent and items in them (for metrics and the benchmark)
        self.batches = 0
        self.items = 0

    def call(self, item: T) -> R:
        """Return `send`'s result for `item`, sent alone or with concurrent callers' items."""
        with self._lock:
            lead = not self._leading
            self._leading = True
            if not lead:
                slot: _Slot[T, R] = _Slot(item)
                self._queue.append(slot)
        if lead:  # nobody is sending (so nobody waits): send ours alone, no slot to wake
            return self._alone(item)
        try:
            slot.wake.acquire()
        except BaseException:
            self._abandon(slot)
            raise
        if not slot.answered:  # handed the lead: our slot is first in the queue
            self._lead(slot)
            if slot.error is not None:
                raise slot.error
        elif slot.error is not None:
            raise CombinedSendError(
                f"the combined send failed: {type(slot.error).__name__}: {slot.error}"
            ) from slot.error
        return slot.result  # type: ignore[return-value]

    def _alone(self, item: T) -> R:
        """The uncontended call: `send([item])` on the caller's thread; callers that arrive
        meanwhile queue up and the oldest of them leads the next batch."""
        try:
            results = self.send([item])
            if len(results) != 1:
                raise CkitError(f"send returned {len(results)} results for 1 item")
            return results[0]
        finally:
            with self._lock:
                self.batches += 1
                self.items += 1
                self._hand_off()

    def _lead(self, mine: _Slot[T, R]) -> None:
        with self._lock:
            batch = self._queue[:self.max_batch]
            del self._queue[:self.max_batch]
        try:
            results = self.send([slot.item for slot in batch])
            if len(results) != len(batch):
                raise CkitError(f"send returned {len(results)} results for {len(batch)} items")
            for slot, result in zip(batch, results):
                slot.result = result
        except BaseException as exc:
            for slot in batch:
                slot.error = exc
        finally:
            for slot in batch:  # answer first, then pass the lead on
                slot.answered = True
                if slot is not mine:
                    slot.wake.release()
            with self._lock:
                self.batches += 1
                self.items += len(batch)
                self._hand_off()

    def _hand_off(self) -> None:
        """Wake the oldest waiter to send the next batch, or stop leading. Holds `_lock`."""
        if self._queue:
            self._queue[0].handed = True
            self._queue[0].wake.release()
        else:
            self._leading = False

    def _abandon(self, slot: _Slot[T, R]) -> None:
        """A waiter was interrupted: drop its item if it is still queued, and pass on the lead
        if it had been handed it. (An item already in a batch is answered to nobody.)"""
        with self._lock:
            if slot in self._queue:
                self._queue.remove(slot)
                if slot.handed:
                    self._hand_off()


# A child process forked while a thread was inside a send would inherit a combiner that is
# "leading" with waiters that do not exist in the child: start every combiner afresh there.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for combiner in list(_LIVE):
        combiner._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
