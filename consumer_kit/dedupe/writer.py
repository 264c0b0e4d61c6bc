"""Redis writes that need not delay a message: the done markers of successful messages.

They are queued and sent in pipelined batches by one daemon thread. Losing some (a crash, Redis
down, a full queue) is harmless: a missing done marker means the next duplicate is caught by the
processed table, and the lease left behind expires on its own. Until a marker lands, a duplicate
finds our lease and is answered busy (redelivered later), never applied twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis

from consumer_kit.core.batching import BatchWorker
from consumer_kit.dedupe.scripts import Call, LuaScript, run_pipelined

DEFAULT_MAX_BATCH = 256



class RedisWriter:
    """Runs Lua script calls off the hot path, in pipelined batches."""

    def __init__(self, client: redis.Redis, *, on_error: Callable[[Exception], None],
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.client = client
        self.on_error = on_error
        self.worker: BatchWorker[Call] = BatchWorker(
            self._send, name="ckit-redis-writer", max_batch=max_batch).start()

    def submit(self, script: LuaScript, keys: Sequence[str], args: Sequence[object]) -> None:
        """Queue a script call; dropped (harmlessly) when the queue is full."""
        self.worker.submit((script, keys, args))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued write was sent (or given up)."""
        return self.worker.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread."""
        self.worker.close(timeout)

    def _send(self, batch: list[Call]) -> None:
        try:
            errors = [a for a in run_pipelined(self.client, batch, alone=False)
                      if isinstance(a, Exception)]
        except redis.RedisError as exc:
            errors = [exc]
        if errors:
            self.on_error(errors[0])
