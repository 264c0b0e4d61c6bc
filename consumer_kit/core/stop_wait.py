"""Waiting for a stop event without holding its lock on the main thread.

`threading.Event.wait` takes the event's lock for a few bytecodes before and after it blocks.
Python runs signal handlers on the main thread, between bytecodes: a handler that sets the
same event (`stop.set()`, `Relay.stop()`) while the main thread is inside those bytecodes
waits for a lock its own thread holds, for good. The loops that can run on the main thread
(`run_consumer`, a relay with one worker, `MultiRelay.run`) wait here instead: on the main
thread by short sleeps and lock-free `is_set()` checks, elsewhere by `Event.wait` (which a
set wakes at once).
"""

from __future__ import annotations

import threading
import time

#: how often the main thread looks at the event: the most a stop waits for it
TICK = 0.05


def wait_for_stop(stop: threading.Event, seconds: float) -> bool:
    """Block for up to `seconds`, or until `stop` is set; return whether it is set.

    On the main thread this never takes the event's lock, so a signal handler there may set
    it (it answers within `TICK`); on other threads it is `stop.wait(seconds)`."""
    if threading.current_thread() is not threading.main_thread():
        return stop.wait(seconds)
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(TICK, left))
    return True
