"""Retry schedules for failed sends: fixed steps, capped, with jitter."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
from collections.abc import Sequence

from consumer_kit.core.errors import ConfigError

#: 1 s, 5 s, 30 s, 1 min, 5 min, then 10 min steps (the source documents' 1/5/30/60... scaled).
DEFAULT_SCHEDULE: tuple[float, ...] = (1, 5, 30, 60, 300, 600)
DEFAULT_JITTER = 0.2


@dataclasses.dataclass(frozen=True)
class Backoff:
    """`delay(n)` is the wait before retry number `n + 1`: schedule[n] (last step repeated),
    scaled by a random factor in [1 - jitter, 1 + jitter] so retries of a burst spread out."""

    schedule: Sequence[float] = DEFAULT_SCHEDULE
    jitter: float = DEFAULT_JITTER

    def __post_init__(self) -> None:
        if not self.schedule or not all(math.isfinite(s) and s >= 0 for s in self.schedule):
            # (an infinite step raised OverflowError in the relay at the first failed send)
            raise ConfigError(f"back-off schedule needs at least one step, each a finite "
                              f"number of seconds >= 0, not {list(self.schedule)!r}")
        if not 0 <= self.jitter < 1:
            raise ConfigError("jitter must be in [0, 1)")

    def delay(self, retry_count: int) -> dt.timedelta:
        """Delay before the next attempt after `retry_count` failures (0-based)."""
        base = self.schedule[min(max(retry_count, 0), len(self.schedule) - 1)]
        factor = 1 + random.uniform(-self.jitter, self.jitter) if self.jitter else 1.0
        return dt.timedelta(seconds=base * factor)
