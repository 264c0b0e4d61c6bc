"""Prometheus metrics of the producer half (registered once, in the default registry)."""

from __future__ import annotations

import sqlalchemy as sa
from prometheus_client import Counter, Gauge
from sqlalchemy.engine import Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.states import OPEN_STATES, OutboxState

SENT = Counter("ckit_outbox_sent", "Outbox messages the broker accepted")
RETRIED = Counter("ckit_outbox_send_retries", "Failed sends scheduled for a retry")
CLAIMS_LOST = Counter("ckit_outbox_claims_lost",
                      "Relay claims rolled back because another relay's won")
FAILED = Counter("ckit_outbox_failed", "Outbox messages that exhausted their send retries")
RECEIPTS = Counter("ckit_outbox_receipts",
                   "Outbox rows receipts made CONSUMED or REJECTED (one per row, however many "
                   "groups' receipts it took)", ["outcome"])
RECEIPTS_DROPPED = Counter(
    "ckit_outbox_receipts_dropped",
    "Receipts that cannot be applied, by reason: malformed (a message or an entry of one that "
    "cannot be read, logged and dropped) or unknown (a message id this outbox does not hold)",
    ["reason"])
BACKLOG = Gauge("ckit_outbox_backlog", "Outbox rows not yet terminal, by database and state",
                ["database", "state"])
CLOCK_OFFSET = Gauge("ckit_outbox_relay_clock_offset_seconds",
                     "The outbox database's clock minus this relay host's, as last measured",
                     ["database"])
OLDEST_UNACKED = Gauge("ckit_outbox_oldest_unacked_seconds",
                       "Age of the oldest SENT row still waiting for its receipts, by database",
                       ["database"])
DISPATCHER_CLOCK_OFFSET = Gauge(
    "ckit_outbox_dispatcher_clock_offset_seconds",
    "The outbox database's clock minus this dispatcher's host's, as last measured", ["database"])


def database_label(engine: Engine) -> str:
    """`host:port/database` of `engine` (no user, no password): a label naming one outbox
    database of a relay that serves several."""
    url = engine.url
    return f"{url.host or ''}:{url.port or ''}/{url.database or ''}"


def refresh_backlog(engine: Engine, table: sa.Table, database: str) -> None:
    """Set the backlog gauges of `database` (`database_label` of the outbox's primary) from
    `engine` (the primary or its replica) with two index-served queries.

    A relay serving several databases keeps one series per database: without the label each
    refresh overwrote the last, and a scrape showed one database's backlog (its FAILED rows
    hid another's). Labelled, the gauges also export nothing in a process that never
    measures them (`ckit consume` and `ckit receipts` import these metrics too: an unlabelled
    gauge read 0, "nothing unacked", there).

    Only the open states are counted: an index range on `state` that stays small, unlike
    CONSUMED, which holds the whole history.
    """
    with engine.connect() as conn:
        counts: dict[int, int] = {int(state): int(n) for state, n in conn.execute(
            sa.select(table.c.state, sa.func.count())
            .where(table.c.state.in_([int(s) for s in OPEN_STATES])).group_by(table.c.state))}
        oldest = conn.execute(
            sa.select(sa.func.min(table.c.sent_at)).where(table.c.state == int(OutboxState.SENT))
        ).scalar()
    for state in OPEN_STATES:
        BACKLOG.labels(database, state.name).set(counts.get(int(state), 0))
    OLDEST_UNACKED.labels(database).set((utcnow() - oldest).total_seconds() if oldest else 0)
