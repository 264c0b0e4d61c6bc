"""How far this host's clock is from the database's, and a warning when it is too far.

Leases, back-offs and timestamps are written with each host's own clock (publish pays no round
trip for one). Two relays, or two SQL transport consumers of one group, whose clocks disagree
by half the lease take what the other still holds (a second send or delivery, which consumers
dedupe). So each measures its host against the database it shares with the others (`ClockWatch`)
and warns beyond a quarter of the lease: two hosts within that of the database are within half
the lease of each other.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import dialect_name
from consumer_kit.core.urls import mask_url

log = logging.getLogger(__name__)

#: the database's UTC time, by dialect (SQLite's is this host's own clock: nothing to measure)
_NOW_SQL = {
    "mysql": "SELECT UTC_TIMESTAMP(6)",
    # clock_timestamp(): now() is the transaction's start
    "postgresql": "SELECT clock_timestamp() AT TIME ZONE 'UTC'",
}


@dataclasses.dataclass(frozen=True)
class ClockOffset:
    """The database's clock minus this host's, measured across one round trip."""

    #: seconds the database's clock is ahead of this host's (negative: behind)
    seconds: float
    #: half the round trip: the measurement is right to within this many seconds
    error: float

    def beyond(self, limit: dt.timedelta) -> bool:
        """True when the clocks surely differ by more than `limit`."""
        return abs(self.seconds) - self.error > limit.total_seconds()

    def describe(self) -> str:
        """'this host's clock is 42.0 s ahead of the database's' (or behind)."""
        side = "behind" if self.seconds > 0 else "ahead of"
        return f"this host's clock is {abs(self.seconds):.1f} s {side} the database's"


def clock_offset(engine: Engine) -> ClockOffset | None:
    """Measure the database's clock against this host's (one query after a warm-up one, so
    that a connect or pre-ping is not timed), or None for a database that reads this host's
    clock (SQLite) or a dialect whose clock this does not know.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be asked.
    """
    query = _NOW_SQL.get(dialect_name(engine))
    if query is None:
        return None
    with engine.connect() as conn:
        conn.exec_driver_sql(query)
        sent, started = utcnow(), time.perf_counter()
        theirs = conn.exec_driver_sql(query).scalar()
        half = (time.perf_counter() - started) / 2
    if not isinstance(theirs, dt.datetime):
        return None
    mine = sent + dt.timedelta(seconds=half)
    return ClockOffset((theirs.replace(tzinfo=None) - mine).total_seconds(), half)


class ClockWatch:
    """Measures this host's clock against the database's when asked (`check`), and warns once
    when it is off by more than a quarter of `lease`, until it is back within."""

    def __init__(self, engine: Engine, lease: dt.timedelta, who: str,
                 on_offset: Callable[[float], None] | None = None) -> None:
        self.engine = engine
        self.lease = lease
        #: what leases these are, for the warning ("relay", "SQL transport consumer of g")
        self.who = who
        #: the largest offset from the database's clock a host may have
        self.limit = lease / 4
        #: called with every measured offset in seconds (a gauge's `set`)
        self.on_offset = on_offset
        #: whether the last measurement was beyond `limit` (warned once until it is not)
        self.skewed = False

    def check(self) -> ClockOffset | None:
        """Measure once; None when the database reads this host's clock (SQLite) or did not
        answer (an outage: the caller's own work reports those)."""
        try:
            offset = clock_offset(self.engine)
        except SQLAlchemyError as exc:
            log.debug("%s: clock check skipped: %s", self.who, exc)
            return None
        if offset is None:
            return None
        if self.on_offset is not None:
            self.on_offset(offset.seconds)
        skewed = offset.beyond(self.limit)
        if skewed != self.skewed:  # said only when it changes: most checks say nothing
            self._say(offset, skewed)
        self.skewed = skewed
        return offset

    def _say(self, offset: ClockOffset, skewed: bool) -> None:
        where = mask_url(self.engine.url.render_as_string(hide_password=True))
        if skewed:
            log.warning(
                "%s on %s: %s (to within %.3f s). Leases are written and judged by each host's "
                "clock: hosts whose clocks differ by half the lease (%.1f s) take what another "
                "still holds, a second send or delivery. Keep every host within a quarter of "
                "the lease (%.1f s) of the database: synchronize the clocks (NTP)",
                self.who, where, offset.describe(), offset.error,
                self.lease.total_seconds() / 2, self.limit.total_seconds())
        else:
            log.warning("%s on %s: the clocks agree again (%s)", self.who, where,
                        offset.describe())
