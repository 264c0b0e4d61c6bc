"""SIGTERM/SIGINT handling for long-running commands: finish the batch, then exit."""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType


def on_shutdown(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM or SIGINT (main thread only); a second signal exits at once."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise SystemExit(128 + signum)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
