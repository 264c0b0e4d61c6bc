"""The plain-SQL engine: the reconcile done with SQLAlchemy Core alone (no Spark, no JVM).

Reads the window's ids through the `(state, sent_at)` index (an index-only scan), then the rows,
the acks and each group's processed rows by primary key in chunks, so the cost follows the window,
not the table. Small deployments run it from cron; the Spark engine is compared against it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.db import make_engine
from consumer_kit.reconcile.classify import classify
from consumer_kit.reconcile.known import KnownIds
from consumer_kit.reconcile.model import (
    IN_CHUNK,
    Evidence,
    Orphan,
    ReconcileConfig,
    WindowRow,
    chunks,
)
from consumer_kit.reconcile.queries import processed_window_conditions, window_conditions
from consumer_kit.reconcile.repair import RepairApplier
from consumer_kit.reconcile.report import ReconcileSummary, SummaryBuilder
from consumer_kit.schema import ack_table, outbox_table, processed_table

log = logging.getLogger("consumer_kit.reconcile.sql_engine")

PROGRESS_EVERY = 10_000

Progress = Callable[[str], None]


class Databases:
    """One SQLAlchemy engine per distinct URL (groups often share the producer's database)."""

    def __init__(self) -> None:
        self._engines: dict[str, sa.Engine] = {}

    def get(self, url: str) -> sa.Engine:
        """Return the engine for `url`, creating it once."""
        if url not in self._engines:
            self._engines[url] = make_engine(url)
        return self._engines[url]

    def dispose(self) -> None:
        """Close every pool."""
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()


def window_ids(conn: sa.Connection, outbox: sa.Table, cutoff: dt.datetime) -> list[int]:
    """Ids of the window: SENT before the cutoff, SENDING with a lease expired before it.

    Two index range scans (`(state, sent_at)` and `(state, next_retry_at)`, both carrying `id`),
    never an OR that could fall back to a table scan.
    """
    ids: list[int] = []
    for cond in window_conditions(outbox, cutoff).values():
        ids.extend(conn.execute(sa.select(outbox.c.id).where(cond)).scalars())
    ids.sort()
    return ids


def window_rows(conn: sa.Connection, outbox: sa.Table, ids: Sequence[int],
                cutoff: dt.datetime) -> list[WindowRow]:
    """Fetch window rows by primary key, re-checking the window condition (rows move)."""
    c = outbox.c
    stmt = sa.select(c.id, c.message_id, c.topic, c.state, c.retry_count, c.max_retries,
                     c.lock_version, c.sent_at, c.lease_until).where(
        c.id.in_(list(ids)), sa.or_(*window_conditions(outbox, cutoff).values()),
    ).order_by(c.id)
    return [
        WindowRow(id=r.id, message_id=r.message_id, topic=r.topic, state=r.state,
                  retry_count=r.retry_count, max_retries=r.max_retries,
                  lock_version=r.lock_version, sent_at=_text(r.sent_at),
                  lease_until=_text(r.lease_until))
        for r in conn.execute(stmt)
    ]


def fetch_evidence(dbs: Databases, config: ReconcileConfig, message_ids: Sequence[str],
                   builder: SummaryBuilder) -> dict[str, list[Evidence]]:
    """Ack rows (producer database) and processed rows (each group's) for `message_ids`."""
    found: dict[str, list[Evidence]] = {}
    names = [g.name for g in config.groups]
    ack = ack_table(sa.MetaData(), config.ack_table)
    with dbs.get(config.producer_url).connect() as conn:
        stmt = sa.select(ack.c.message_id, ack.c.consumer_group, ack.c.outcome, ack.c.reason).where(
            ack.c.message_id.in_(list(message_ids)), ack.c.consumer_group.in_(names))
        rows = conn.execute(stmt).all()
    builder.read("acks", len(rows))
    for r in rows:
        found.setdefault(r.message_id, []).append(
            Evidence(group=r.consumer_group, ack_outcome=r.outcome, ack_reason=r.reason))
    for group in config.groups:
        processed = processed_table(sa.MetaData(), group.table)
        p = processed.c
        with dbs.get(group.url).connect() as conn:
            stmt = sa.select(p.message_id, p.status, p.error).where(
                p.consumer_group == group.name, p.message_id.in_(list(message_ids)))
            rows = conn.execute(stmt).all()
        builder.read(f"processed:{group.name}", len(rows))
        for r in rows:
            found.setdefault(r.message_id, []).append(
                Evidence(group=group.name, processed_status=r.status, processed_error=r.error))
    return found


def find_orphans(dbs: Databases, config: ReconcileConfig, cutoff: dt.datetime,
                 builder: SummaryBuilder) -> Iterator[Orphan]:
    """Processed rows of the processed window (`cutoff - orphan_window` to `cutoff`) whose
    message id has no outbox row. Report only."""
    if config.orphan_window <= dt.timedelta(0):
        return
    known_ids = KnownIds(dbs.get(config.producer_url), config.outbox_table)
    for group in config.groups:
        processed = processed_table(sa.MetaData(), group.table)
        p = processed.c
        conds = processed_window_conditions(processed, group, since=cutoff - config.orphan_window,
                                            until=cutoff, src=config.src)
        with dbs.get(group.url).connect() as conn:
            rows = conn.execute(
                sa.select(p.message_id, p.topic, p.status, p.processed_at).where(*conds)).all()
        builder.read(f"orphan_scan:{group.name}", len(rows))
        for r in known_ids.unknown(rows, lambda r: str(r.message_id)):
            yield Orphan(group=group.name, message_id=r.message_id, topic=r.topic,
                         status=r.status, processed_at=_text(r.processed_at))


def run_sql(config: ReconcileConfig, *, now: dt.datetime, progress: Progress) -> ReconcileSummary:
    """Run the reconcile with SQLAlchemy only. See `consumer_kit.reconcile.run_reconcile`."""
    cutoff = now - config.stuck_after
    builder = SummaryBuilder(config, now=now, cutoff=cutoff)
    dbs = Databases()
    started = time.monotonic()
    try:
        producer = dbs.get(config.producer_url)
        outbox = outbox_table(sa.MetaData(), config.outbox_table)
        with producer.connect() as conn:
            ids = window_ids(conn, outbox, cutoff)
        builder.summary.durations["window_ids"] = time.monotonic() - started
        progress(f"window: {len(ids)} outbox rows before cutoff {cutoff.isoformat(sep=' ')}")
        applier = RepairApplier(producer, outbox=config.outbox_table, ack=config.ack_table,
                                now=now, dry_run=config.dry_run, batch_size=config.batch_size)
        done = 0
        for chunk in chunks(ids, IN_CHUNK):
            with producer.connect() as conn:
                rows = window_rows(conn, outbox, chunk, cutoff)
            builder.read("window", len(rows))
            evidence = fetch_evidence(dbs, config, [r.message_id for r in rows], builder)
            for row in rows:
                decision = classify(row, evidence.get(row.message_id, ()), config.groups,
                                    max_retries=config.max_retries)
                builder.decision(decision)
                applier.add(decision)
            done += len(chunk)
            if done % PROGRESS_EVERY < IN_CHUNK or done == len(ids):
                progress(f"classified {done}/{len(ids)}")
        result = applier.finish()
        builder.summary.durations["window_and_repairs"] = time.monotonic() - started
        orphan_started = time.monotonic()
        for orphan in find_orphans(dbs, config, cutoff, builder):
            builder.orphan(orphan)
        builder.summary.durations["orphans"] = time.monotonic() - orphan_started
    finally:
        dbs.dispose()
    builder.summary.durations["total"] = time.monotonic() - started
    return builder.finish(result)


def _text(value: Any) -> str | None:
    """Timestamps as text (`YYYY-MM-DD HH:MM:SS.ffffff`), the form both engines report."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    return str(value)
