"""Time helpers: every timestamp the library stores is naive UTC with microseconds."""

from __future__ import annotations

import datetime as dt
import time

from consumer_kit.core.errors import ConfigError

#: Longest duration `parse_duration` accepts: anything longer is a typo, and `now - duration`
#: must stay a valid date.
MAX_DURATION = dt.timedelta(days=36525)

_EPOCH = dt.datetime(1970, 1, 1)


def utcnow() -> dt.datetime:
    """Return the current UTC time as a naive datetime (what every table stores)."""
    # the epoch plus the system clock's microseconds: the value of
    # `datetime.now(timezone.utc).replace(tzinfo=None)` in two thirds of its time (publish
    # pays it on every message)
    return _EPOCH + dt.timedelta(microseconds=time.time_ns() // 1000)


def epoch_ms() -> int:
    """Return the current time in epoch milliseconds (the envelope's `ckit_sent`)."""
    return time.time_ns() // 1_000_000


_MILLISECOND = dt.timedelta(milliseconds=1)


def to_epoch_ms(value: dt.datetime) -> int:
    """Convert a naive-UTC (or an aware) datetime to epoch milliseconds (exact integer
    arithmetic, rounded down: no float in between)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return (value - _EPOCH) // _MILLISECOND


def parse_duration(text: str, *, option: str | None = None) -> dt.timedelta:
    """Parse `30d`, `12h`, `10m`, `45s`, `250ms`, `2w` or a bare number of seconds (>= 0).

    Raises:
        ConfigError: the text is not a finite, non-negative duration of at most 100 years (the
            message names `option` when given).

    >>> parse_duration("10m")
    datetime.timedelta(seconds=600)
    """
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    raw = str(text).strip().lower()
    what = f"{option} " if option else ""
    for suffix in ("ms", "s", "m", "h", "d", "w", ""):
        number = raw[: len(raw) - len(suffix)] if suffix else raw
        if raw.endswith(suffix) and number.replace(".", "", 1).isdigit():
            seconds = float(number) * units.get(suffix, 1.0)
            if seconds > MAX_DURATION.total_seconds():
                raise ConfigError(f"{what}{text!r} is longer than 100 years")
            return dt.timedelta(seconds=seconds)
    raise ConfigError(f"{what}{text!r} is not a duration (use e.g. 30d, 12h, 10m, 45s, 250ms)")


def unit_note(text: str) -> str:
    """For a refusal quoting a duration the operator gave: how a bare number was read
    (` (read as 14 seconds: a number without a unit is seconds; days are 14d)`), else "".

    >>> unit_note("14"), unit_note("14d")
    (' (read as 14 seconds: a number without a unit is seconds; days are 14d)', '')
    """
    raw = str(text).strip()
    if not raw.replace(".", "", 1).isdigit():
        return ""
    return (f" (read as {raw} seconds: a number without a unit is seconds; days are "
            f"{raw}d)")


def duration_text(value: dt.timedelta) -> str:
    """A whole duration in its largest exact unit, as `parse_duration` reads it back.

    >>> duration_text(dt.timedelta(minutes=10)), duration_text(dt.timedelta(0))
    ('10m', '0')
    """
    seconds = value.total_seconds()
    for suffix, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds and seconds % size == 0:
            return f"{int(seconds // size)}{suffix}"
    return f"{seconds:g}"
