"""Redis writes that need not delay a message: done markers and lease releases.

They are queued and sent in pipelined batches by one daemon thread. Losing some (a crash, Redis
down) is harmless: a missing done marker means the next duplicate is caught by the processed
table, and a lease left behind expires on its own.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

import redis
from redis.commands.core import Script

log = logging.getLogger("consumer_kit.dedupe.redis")

DEFAULT_MAX_BATCH = 256
DEFAULT_QUEUE_SIZE = 100_000

Write = tuple[Script, Sequence[str], Sequence[object]]


class RedisWriter:
    """Runs Lua script calls off the hot path, in pipelined batches."""

    def __init__(self, client: redis.Redis, *, on_error: Callable[[Exception], None],
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.client = client
        self.on_error = on_error
        self.max_batch = max_batch
        self.queue: queue.Queue[Write | None] = queue.Queue(DEFAULT_QUEUE_SIZE)
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ckit-redis-writer", daemon=True)
        self._thread.start()

    def submit(self, script: Script, keys: Sequence[str], args: Sequence[object]) -> None:
        """Queue a script call; dropped (harmlessly) when the queue is full."""
        with self._cond:
            self._pending += 1
        try:
            self.queue.put_nowait((script, keys, args))
        except queue.Full:
            self._done(1)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued write was sent (or given up)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread."""
        self.flush(timeout)
        self.queue.put(None)
        self._thread.join(timeout)

    def _done(self, n: int) -> None:
        with self._cond:
            self._pending -= n
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._send(batch)
            if stop:
                return

    def _send(self, batch: list[Write]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for script, keys, args in batch:
                script(keys=keys, args=args, client=pipe)
            pipe.execute()
        except redis.RedisError as exc:
            self.on_error(exc)
        except Exception:  # never let the writer thread die
            log.exception("redis writer: batch of %d dropped", len(batch))
        finally:
            self._done(len(batch))
