"""The plain-SQL source of the reconciler (`--engine sql`): SQLAlchemy Core alone, no JVM.

Small deployments run it from cron; the Spark source is compared against it. The reads
(`window_ids`, `window_rows`, `fetch_evidence`) are also what the Spark source falls back to for
message ids it cannot quote into a JDBC query.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.db import Engines
from consumer_kit.core.schema import outbox_table, processed_table, receipt_table
from consumer_kit.reconcile.conditions import (
    HORIZON_COLUMN,
    processed_window_conditions,
    window_columns,
    window_conditions,
)
from consumer_kit.reconcile.model import (
    IN_CHUNK,
    Evidence,
    GroupSource,
    Orphan,
    Producer,
    ReconcileConfig,
    WindowRow,
    chunks,
)
from consumer_kit.reconcile.report import SummaryBuilder
from consumer_kit.reconcile.source import Source


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
                cutoff: dt.datetime, horizon: dt.datetime, *, shard: int = 0
                ) -> list[WindowRow]:
    """Fetch window rows by primary key, re-checking the window condition (rows move); `shard`
    is the producer database they are read from, `horizon` the dedupe horizon's moment."""
    c = outbox.c
    stmt = sa.select(*window_columns(outbox, horizon)).where(
        c.id.in_(list(ids)), sa.or_(*window_conditions(outbox, cutoff).values()),
    ).order_by(c.id)
    return [WindowRow(**{**r._mapping, "sent_at": _text(r.sent_at),
                         "lease_until": _text(r.lease_until),
                         HORIZON_COLUMN: bool(r._mapping[HORIZON_COLUMN])}, shard=shard)
            for r in conn.execute(stmt)]


def fetch_evidence(dbs: Engines, config: ReconcileConfig, message_ids: Sequence[str],
                   builder: SummaryBuilder, *, receipts_url: str | None = None
                   ) -> dict[str, list[Evidence]]:
    """Receipt rows (from `receipts_url`, default the producer database) and processed rows
    (each group's) for `message_ids`."""
    found: dict[str, list[Evidence]] = {}
    names = [g.name for g in config.groups]
    rt = receipt_table(sa.MetaData(), config.receipt_table)
    with dbs.get(receipts_url or config.producer_url).connect() as conn:
        stmt = sa.select(rt.c.message_id, rt.c.consumer_group, rt.c.outcome, rt.c.reason).where(
            rt.c.message_id.in_(list(message_ids)), rt.c.consumer_group.in_(names))
        rows = conn.execute(stmt).all()
    builder.read("receipts", len(rows))
    for r in rows:
        found.setdefault(r.message_id, []).append(
            Evidence(group=r.consumer_group, receipt_outcome=r.outcome, receipt_reason=r.reason))
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


class SqlSource(Source):
    """The plain-SQL source: SQLAlchemy Core only, no JVM. The window's ids come through the
    `(state, sent_at)` and `(state, next_retry_at)` indexes (index-only scans), then the rows,
    the receipts and each group's processed rows by primary key in chunks, so the cost follows
    the window, not the table. Producer databases (shards) are read one after the other, each
    on its read replica when it has one."""

    def window(self) -> Iterator[tuple[WindowRow, Sequence[Evidence]]]:
        for producer in self.run.config.producers:
            yield from self._window(producer)

    def _window(self, producer: Producer) -> Iterator[tuple[WindowRow, Sequence[Evidence]]]:
        run = self.run
        config, builder = run.config, run.builder
        reads = run.engines.get(producer.scan_url)
        outbox = outbox_table(sa.MetaData(), config.outbox_table)
        started = time.monotonic()
        with reads.connect() as conn:
            ids = window_ids(conn, outbox, run.cutoff)
        durations = builder.summary.durations
        durations["window_ids"] = durations.get("window_ids", 0.0) + time.monotonic() - started
        where = f" of producer {producer.index}" if len(config.producers) > 1 else ""
        run.progress(f"window{where}: {len(ids)} outbox rows before cutoff "
                     f"{run.cutoff.isoformat(sep=' ')}")
        for chunk in chunks(ids, IN_CHUNK):
            with reads.connect() as conn:
                rows = window_rows(conn, outbox, chunk, run.cutoff, run.horizon,
                                   shard=producer.index)
            builder.read("window", len(rows))
            evidence = fetch_evidence(run.engines, config, [r.message_id for r in rows],
                                      builder, receipts_url=producer.scan_url)
            for row in rows:
                yield row, evidence.get(row.message_id, ())

    def orphan_candidates(self, group: GroupSource, since: dt.datetime) -> Iterator[Orphan]:
        run = self.run
        processed = processed_table(sa.MetaData(), group.table)
        p = processed.c
        conds = processed_window_conditions(processed, group, since=since, until=run.cutoff,
                                            src=run.config.src)
        with run.engines.get(group.url).connect() as conn:
            rows = conn.execute(
                sa.select(p.message_id, p.topic, p.status, p.processed_at).where(*conds)).all()
        run.builder.read(f"orphan_scan:{group.name}", len(rows))
        for r in rows:
            yield Orphan(group=group.name, message_id=r.message_id, topic=r.topic,
                         status=r.status, processed_at=_text(r.processed_at))


def _text(value: Any) -> str | None:
    """Timestamps as text (`YYYY-MM-DD HH:MM:SS.ffffff`), the form both engines report."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    return str(value)
