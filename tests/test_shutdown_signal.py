"""A shutdown signal (SIGTERM, Ctrl-C) of the long-running commands (`ckit consume`, `relay`,
`receipts`) stops them even when it lands while the main thread holds the stop event's lock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The main thread of `ckit consume` waits on its stop event every 50 ms (`run_consumer`);
# `Event.wait` holds the event's lock for a few bytecodes before and after it blocks, and a
# signal handler runs on the main thread between bytecodes. Holding the lock and raising the
# signal lands the handler exactly there.
SCRIPT = textwrap.dedent("""
    import signal, threading
    from consumer_kit.cli.runtime import on_shutdown

    stop = threading.Event()
    on_shutdown(stop.set)
    with stop._cond:  # what Event.wait holds around its wait
        signal.raise_signal(signal.SIGTERM)
        for _ in range(100):  # bytecodes: the handler runs here
            pass
    print("stopped" if stop.wait(5) else "not stopped", flush=True)
""")


def test_a_shutdown_signal_landing_while_the_main_thread_holds_the_stop_lock_still_stops() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("the signal handler deadlocked on the stop event's lock (the "
                             "process kept consuming after SIGTERM)") from None
    assert done.stdout.strip() == "stopped", done.stderr
