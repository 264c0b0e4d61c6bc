"""`ckit outbox stats`: counts per state, oldest PENDING and SENT ages, sent-to-consumed lag."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import check_tables
from consumer_kit.core.states import OutboxState

DEFAULT_LAG_WINDOW = dt.timedelta(hours=1)
DEFAULT_LAG_SAMPLE = 10_000


@dataclasses.dataclass(frozen=True)
class LagStats:
    """Sent-to-consumed lag in seconds over a sample of recently sent, now consumed rows."""

    samples: int
    p50: float
    p95: float
    max: float


@dataclasses.dataclass(frozen=True)
class OutboxStats:
    """What `ckit outbox stats` prints."""

    counts: dict[str, int]
    total: int
    oldest_pending_age_s: float | None
    oldest_sent_age_s: float | None
    lag: LagStats | None
    lag_window_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence (`fraction` in 0..1)."""
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


def stats(
    engine: Engine,
    table: sa.Table,
    *,
    lag_window: dt.timedelta = DEFAULT_LAG_WINDOW,
    lag_sample: int = DEFAULT_LAG_SAMPLE,
    now: dt.datetime | None = None,
) -> OutboxStats:
    """Counts per state (every state, 0 when absent), oldest PENDING/SENT ages and the lag.

    Ages are measured from `gmt_create` (PENDING) and `sent_at` (SENT). The lag is computed in
    Python over at most `lag_sample` CONSUMED rows sent within `lag_window` (served by the
    `(state, sent_at)` index); rows whose ack beat the SENT mark count as 0 s.

    Raises:
        SchemaError: the table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    check_tables(engine, table)
    now = now or utcnow()
    c = table.c
    with engine.connect() as conn:
        counts = {s.name: 0 for s in OutboxState}
        for state, count in conn.execute(sa.select(c.state, sa.func.count()).group_by(c.state)):
            try:
                counts[OutboxState(state).name] = int(count)
            except ValueError:  # a code this version does not know: still count it
                counts[f"UNKNOWN_{state}"] = int(count)
        oldest_pending = conn.scalar(
            sa.select(sa.func.min(c.gmt_create)).where(c.state == OutboxState.PENDING)
        )
        oldest_sent = conn.scalar(
            sa.select(sa.func.min(c.sent_at)).where(c.state == OutboxState.SENT)
        )
        rows = conn.execute(
            sa.select(c.sent_at, c.consumed_at)
            .where(c.state == OutboxState.CONSUMED, c.sent_at >= now - lag_window)
            .order_by(c.sent_at.desc())
            .limit(lag_sample)
        ).all()
    lags = sorted(
        max(0.0, (consumed - sent).total_seconds()) for sent, consumed in rows if consumed and sent
    )
    lag = (
        LagStats(len(lags), percentile(lags, 0.5), percentile(lags, 0.95), lags[-1])
        if lags
        else None
    )
    return OutboxStats(
        counts=counts,
        total=sum(counts.values()),
        oldest_pending_age_s=_age(now, oldest_pending),
        oldest_sent_age_s=_age(now, oldest_sent),
        lag=lag,
        lag_window_s=lag_window.total_seconds(),
    )


def _age(now: dt.datetime, then: dt.datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())
