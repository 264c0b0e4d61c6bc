"""The handler deadline (xxl-mq's timeout control): one watchdog thread per pipeline.

While a handler runs, the watchdog renews its Redis handler lease (so no second consumer starts
the same message meanwhile), and once the handler is past its `timeout` it reports it once (a
warning with the message id, `ckit_handler_timeouts`). Python cannot stop a running thread: the
pipeline rolls the handler's transaction back when it returns past its deadline, and the
message is redelivered. A handler without a session has no transaction to roll back: its
effect stays when it returns (at-least-once), and the warning says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: the watchdog's longest tick (it ticks faster when leases are short)
TICK = 0.5


@dataclasses.dataclass
class _Running:
    message_id: str
    handler: str
    deadline: float
    renew: Callable[[], object] | None
    next_renew: float
    rolls_back: bool
    reported: bool = False


class Watchdog:
    """Watches running handlers: renews their leases, reports the ones past their deadline."""

    def __init__(self, *, renew_every: float, name: str) -> None:
        self.renew_every = max(0.05, renew_every)
        self.tick = min(TICK, self.renew_every / 2)
        self._running: dict[int, _Running] = {}
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, message_id: str, handler: str, timeout: float, *,
              renew: Callable[[], object] | None, rolls_back: bool = True) -> int:
        """Start watching a handler; returns the key to `done` with. `rolls_back`: the handler
        runs in a transaction the pipeline rolls back past the deadline (False for a handler
        without a session, whose effect stays)."""
        now = time.monotonic()
        key = next(self._keys)
        with self._lock:
            self._running[key] = _Running(message_id, handler, now + timeout, renew,
                                          now + self.renew_every, rolls_back)
        return key

    def done(self, key: int) -> bool:
        """Stop watching; True when the handler was past its deadline (logged once, here or by
        the watchdog while it ran)."""
        with self._lock:
            running = self._running.pop(key, None)
        if running is None or time.monotonic() <= running.deadline:
            return False
        if not running.reported and running.rolls_back:  # without: the pipeline says what stays
            log.warning("message %s: handler %s returned past its timeout; rolled back, "
                        "redelivered", running.message_id, running.handler)
        return True

    def stop(self) -> None:
        """Stop the thread (handlers still running are no longer watched)."""
        self._stopped = True
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self.tick)
            now = time.monotonic()
            with self._lock:
                due = [r for r in self._running.values()
                       if (not r.reported and now > r.deadline)
                       or (r.renew is not None and now >= r.next_renew)]
            for r in due:
                if not r.reported and now > r.deadline:
                    r.reported = True
                    log.warning("message %s: handler %s is past its timeout; %s",
                                r.message_id, r.handler,
                                "its transaction will be rolled back when it returns and the "
                                "message redelivered" if r.rolls_back else
                                "it has no session, so its effect stays when it returns "
                                "(at-least-once)")
                if r.renew is not None and now >= r.next_renew:
                    r.next_renew = now + self.renew_every
                    try:
                        r.renew()
                    except Exception as exc:  # Redis away: the database path still decides
                        log.debug("message %s: lease renewal failed: %s", r.message_id, exc)
