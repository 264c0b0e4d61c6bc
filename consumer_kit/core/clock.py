"""Time helpers: every timestamp the library stores is naive UTC with microseconds."""

from __future__ import annotations

import datetime as dt
import time

from consumer_kit.core.errors import ConfigError


def utcnow() -> dt.datetime:
    """Return the current UTC time as a naive datetime (what every table stores)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def epoch_ms() -> int:
    """Return the current time in epoch milliseconds (the envelope's `ckit_sent`)."""
    return time.time_ns() // 1_000_000


def to_epoch_ms(value: dt.datetime) -> int:
    """Convert a naive-UTC datetime to epoch milliseconds."""
    return int(value.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def parse_duration(text: str, *, option: str | None = None) -> dt.timedelta:
    """Parse `30d`, `12h`, `10m`, `45s`, `250ms`, `2w` or a bare number of seconds (>= 0).

    Raises:
        ConfigError: the text is not a finite, non-negative duration (the message names
            `option` when given).

    >>> parse_duration("10m")
    datetime.timedelta(seconds=600)
    """
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    raw = str(text).strip().lower()
    for suffix in ("ms", "s", "m", "h", "d", "w", ""):
        number = raw[: len(raw) - len(suffix)] if suffix else raw
        if raw.endswith(suffix) and number.replace(".", "", 1).isdigit():
            return dt.timedelta(seconds=float(number) * units.get(suffix, 1.0))
    what = f"{option} " if option else ""
    raise ConfigError(f"{what}{text!r} is not a duration (use e.g. 30d, 12h, 10m, 45s, 250ms)")
