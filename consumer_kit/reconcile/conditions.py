"""The SQL conditions both engines share: the window and the orphan scan's processed window.

Both sources read with these (the Spark source compiles them to SQL text with literal values for
its JDBC reads), so "what is in the window" and its columns are written once.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile.model import GroupSource

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


#: The columns every source reads of a window row (`WindowRow`'s fields).
WINDOW_COLUMNS = ("id", "message_id", "topic", "state", "retry_count", "max_retries",
                  "lock_version", "sent_at", "lease_until")
#: The columns the orphan scan reads of a processed row (`Orphan`'s fields).
ORPHAN_COLUMNS = ("message_id", "topic", "status", "processed_at")


#: The window row's flag `WindowRow.before_horizon`, computed by the database (1 or 0).
HORIZON_COLUMN = "before_horizon"


def window_columns(outbox: sa.Table, horizon: dt.datetime) -> list[sa.ColumnElement[Any]]:
    """`WINDOW_COLUMNS`, then `HORIZON_COLUMN`: 1 when the row was made (`gmt_create`) before
    `horizon` (`now - DEDUPE_HORIZON`), else 0. Compared in the database, so no engine parses
    another database's timestamp text."""
    return [*(outbox.c[n] for n in WINDOW_COLUMNS),
            sa.case((outbox.c.gmt_create < horizon, 1), else_=0).label(HORIZON_COLUMN)]


def window_select(outbox: sa.Table, part: str, cutoff: dt.datetime,
                  horizon: dt.datetime) -> sa.Select[Any]:
    """`SELECT <window_columns> FROM outbox WHERE <window_conditions[part]>` (`sent` or
    `sending`): what the Spark source reads over JDBC, compiled with literal values."""
    return sa.select(*window_columns(outbox, horizon)).where(
        window_conditions(outbox, cutoff)[part])


def processed_window_select(processed: sa.Table, group: GroupSource, *, since: dt.datetime,
                            until: dt.datetime, src: str | None) -> sa.Select[Any]:
    """The orphan scan's read of one group (`processed_window_conditions`)."""
    return sa.select(*(processed.c[n] for n in ORPHAN_COLUMNS)).where(
        *processed_window_conditions(processed, group, since=since, until=until, src=src))
