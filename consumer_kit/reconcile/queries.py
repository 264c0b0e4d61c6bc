"""The SQL conditions both engines share: the window and the orphan scan's processed window.

The Spark engine sizes its JDBC reads with these conditions on the driver, the SQL engine reads
with them directly, so "what is in the window" is written once.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from consumer_kit.reconcile.model import GroupSource
from consumer_kit.schema import OutboxState

Condition = sa.ColumnElement[bool]


def window_conditions(outbox: sa.Table, cutoff: dt.datetime) -> dict[str, Condition]:
    """`{"sent": ..., "sending": ...}`: SENT before the cutoff, SENDING with a lease expired
    before it. Each part is an index range scan on its own (`(state, sent_at)`,
    `(state, next_retry_at)`); OR them only over rows already fetched by primary key.

    >>> conds = window_conditions(outbox_table(sa.MetaData()), utcnow())  # doctest: +SKIP
    >>> sa.select(sa.func.count()).where(conds["sent"])                   # doctest: +SKIP
    """
    c = outbox.c
    return {
        "sent": sa.and_(c.state == int(OutboxState.SENT), c.sent_at < cutoff),
        "sending": sa.and_(c.state == int(OutboxState.SENDING), c.lease_until < cutoff),
    }


def processed_window_conditions(processed: sa.Table, group: GroupSource, *, since: dt.datetime,
                                until: dt.datetime, src: str | None) -> list[Condition]:
    """The orphan scan's rows of `group`: `since <= processed_at < until`, only from producer
    `src` when given, only the group's topics when it names any."""
    p = processed.c
    conds: list[Condition] = [p.consumer_group == group.name, p.processed_at >= since,
                              p.processed_at < until]
    if src:
        conds.append(p.src == src)
    if group.topics:
        conds.append(p.topic.in_(group.topics))
    return conds
