"""Time helpers: every timestamp the library stores is naive UTC with microseconds."""

from __future__ import annotations

import datetime as dt
import time


def utcnow() -> dt.datetime:
    """Return the current UTC time as a naive datetime (what every table stores)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def epoch_ms() -> int:
    """Return the current time in epoch milliseconds (the envelope's `ckit_sent`)."""
    return time.time_ns() // 1_000_000


def to_epoch_ms(value: dt.datetime) -> int:
    """Convert a naive-UTC datetime to epoch milliseconds."""
    return int(value.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def parse_duration(text: str) -> dt.timedelta:
    """Parse `30d`, `12h`, `10m`, `45s`, `250ms` or a bare number of seconds.

    Raises:
        ValueError: when the text is not a duration.

    >>> parse_duration("10m")
    datetime.timedelta(seconds=600)
    """
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    raw = text.strip().lower()
    for suffix in ("ms", "s", "m", "h", "d", "w"):
        if raw.endswith(suffix) and raw[: -len(suffix)].replace(".", "", 1).isdigit():
            return dt.timedelta(seconds=float(raw[: -len(suffix)]) * units[suffix])
    if raw.replace(".", "", 1).isdigit():
        return dt.timedelta(seconds=float(raw))
    raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 10m, 45s, 250ms)")
