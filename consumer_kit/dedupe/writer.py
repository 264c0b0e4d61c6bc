"""Redis writes that need not delay a message: the done markers of successful messages.

They wait in a queue and ride along with the next claim a consume thread sends (`take`): the
claim's round trip carries them, and no other thread wakes. A daemon thread sends, in one
pipelined batch, what no claim took within `linger` seconds (the last messages of a burst, or
a consumer whose claims go the synchronous way while duplicates are frequent).

Losing some (a crash, Redis down, a full queue) is harmless: a missing done marker means the
next duplicate is caught by the processed table, and the lease left behind expires on its own.
Until a marker lands, a duplicate finds our lease and is answered busy (redelivered later),
never applied twice.

Why not a thread woken per marker: with one message at a time, the writer woke once per
message and took the interpreter lock from the consume thread while it waited on the database,
so the consume thread waited for it on its way back; that cost more than the claim itself
(`python -m bench.peers --measures dedupe`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

import redis

from consumer_kit.dedupe.scripts import Call, LuaScript, run_pipelined

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 256
#: seconds a queued marker waits for a claim to carry it before the thread sends it
DEFAULT_LINGER = 0.02
#: markers queued at most; more are dropped (harmlessly, see the module docstring)
DEFAULT_MAX_QUEUED = 100_000
#: markers one claim carries at most (its round trip grows with them)
RIDERS_PER_CLAIM = 64


class RedisWriter:
    """Queues Lua script calls for claims to carry; sends the rest from its own thread."""

    def __init__(self, client: redis.Redis, *, on_error: Callable[[Exception], None],
                 on_ok: Callable[[int], None] = lambda since: None,
                 generation: Callable[[], int] = lambda: 0,
                 hold: Callable[[], float] = lambda: 0.0,
                 max_batch: int = DEFAULT_MAX_BATCH, linger: float = DEFAULT_LINGER,
                 max_queued: int = DEFAULT_MAX_QUEUED) -> None:
        self.client = client
        self.on_error = on_error
        #: called after a batch Redis took without an error, with `generation()` as it was
        #: before the batch went out (the store leaves degraded mode unless a failure came
        #: since: with `redis_claims="adaptive"` no claim may come to tell it Redis is back)
        self.on_ok = on_ok
        self.generation = generation
        #: seconds the thread waits before sending (the store degraded: Redis is tried again
        #: once its window ends, as the claims try it, not at every batch of a long outage)
        self.hold = hold
        self.max_batch = max_batch
        self.linger = linger
        self.max_queued = max_queued
        #: calls dropped because the queue was full
        self.dropped = 0
        self._calls: collections.deque[Call] = collections.deque()
        #: calls no claim may carry (a claim carries done markers only): the thread sends them
        self._unridden: collections.deque[Call] = collections.deque()
        self._queued = threading.Event()
        self._stop = threading.Event()
        # Held while the thread (or `flush`) takes a batch and sends it: `flush` acquiring it
        # knows that no batch taken from the queue is still on its way.
        self._sending = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ckit-redis-writer", daemon=True)
        self._thread.start()

    def submit(self, script: LuaScript, keys: Sequence[str], args: Sequence[str], *,
               ride: bool = True) -> None:
        """Queue a script call; dropped (harmlessly, counted) when the queue is full or the
        writer is closed. `ride=False`: no claim carries it (not a done marker), the thread
        sends it."""
        if len(self._calls) + len(self._unridden) >= self.max_queued or self._stop.is_set():
            self.dropped += 1
            if self.dropped == 1:  # harmless (module docstring), but never unsaid
                log.warning("redis writer: done marker or lease release dropped (%s); the "
                            "processed table catches its duplicates, a lease ends by itself",
                            "closed" if self._stop.is_set() else f"{self.max_queued} queued")
            return
        (self._calls if ride else self._unridden).append((script, keys, args))
        if not self._queued.is_set():
            self._queued.set()

    def take(self, limit: int = RIDERS_PER_CLAIM) -> list[Call]:
        """Up to `limit` queued calls, oldest first, for a claim to carry (its script runs
        them: `RedisDedupe.claim_call`; the caller `resubmit`s them when Redis had lost it)."""
        calls = self._calls
        out: list[Call] = []
        while calls and len(out) < limit:
            try:
                out.append(calls.popleft())
            except IndexError:  # another thread took the last one
                break
        return out

    def resubmit(self, calls: Sequence[Call]) -> None:
        """Queue again calls a claim carried but Redis did not run (it had lost the script):
        the next claim carries them, or the thread sends them."""
        for script, keys, args in calls:
            self.submit(script, keys, args)

    def flush(self, timeout: float = 5.0) -> bool:
        """Send every queued call now, on the calling thread (tried once each: a call Redis
        refused or could not take is lost, harmlessly); True when none is left queued and none
        is still on its way from the writer thread. Calls a claim took are not waited for:
        they travel with that claim, on its thread."""
        if not self._sending.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            deadline = time.monotonic() + timeout
            while (self._calls or self._unridden) and time.monotonic() < deadline:
                self._send(self._batch())
            return not (self._calls or self._unridden)
        finally:
            self._sending.release()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread, then send what is queued (up to `timeout`); later calls are
        dropped."""
        self._stop.set()
        self._queued.set()
        self._thread.join(timeout)
        self.flush(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._queued.wait()
            # Give the consume threads' next claims the chance to carry what is queued.
            self._stop.wait(self.linger)
            self._queued.clear()  # before taking: a call queued after this sets it again
            while (self._calls or self._unridden) and not self._stop.is_set():
                held = self.hold()
                if held > 0:  # degraded: wait for the window to end (or `close`)
                    self._stop.wait(held)
                    continue
                with self._sending:  # (`close` sends the rest itself)
                    batch = self._batch()
                    if batch:
                        self._send(batch)

    def _batch(self) -> list[Call]:
        """Up to `max_batch` queued calls: done markers first, then the unridden."""
        batch = self.take(self.max_batch)
        while self._unridden and len(batch) < self.max_batch:
            try:
                batch.append(self._unridden.popleft())
            except IndexError:  # another thread took the last one
                break
        return batch

    def _send(self, batch: list[Call]) -> None:
        since = self.generation()
        try:
            errors = [a for a in run_pipelined(self.client, batch, alone=False)
                      if isinstance(a, Exception)]
        except redis.RedisError as exc:
            errors = [exc]
            # Redis is away: what is queued would fail the same way. Dropped (harmlessly, as
            # this batch's calls are) rather than kept to pile up for the whole outage
            self._calls.clear()
            self._unridden.clear()
        except Exception as exc:  # the thread must survive anything
            errors = [exc]
        try:
            if errors:
                self.on_error(errors[0])
            else:
                self.on_ok(since)
        except Exception:  # the thread must survive its callbacks too
            log.exception("redis writer: %s callback failed", "error" if errors else "ok")
