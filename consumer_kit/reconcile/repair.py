"""Guarded compare-and-set repairs, many rows per statement.

Decisions are buffered per `(class, expected state, lock_version)`; each full buffer becomes one
compare-and-set of the class's state machine transition (`TRANSITION`, through
`consumer_kit.core.transitions.cas`)::

    UPDATE outbox SET state = :target, lock_version = lock_version + 1, gmt_modified = :now,
                      updated_by = 'reconciler', ...
     WHERE id IN (:ids) AND lock_version = :seen AND state = :expected

Per-row values (a rejection reason) go through a bound `CASE id WHEN ... THEN ...`. The row count
says how many were applied; the difference from the ids sent is reported as conflicts (the row
moved between read and write: it is left alone). When some rows conflicted, or receipts must be
inserted, a fingerprint select (`updated_by`, `gmt_modified = :now`, `lock_version = seen + 1`)
tells which ids were ours. Receipt rows for RECEIPT_LOST are inserted in the same transaction,
skipping rows that exist.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.db import insert_new
from consumer_kit.core.receipt import ReceiptOutcome
from consumer_kit.core.schema import outbox_table, receipt_table
from consumer_kit.core.states import OutboxState, Transition, transition
from consumer_kit.core.transitions import Versions, cas, per_row
from consumer_kit.reconcile.model import DEFAULT_BATCH_SIZE, RECONCILER, Decision, RepairClass

log = logging.getLogger(__name__)

#: The state machine transition (core/states.py) each repairing class applies.
TRANSITION: dict[RepairClass, Transition] = {
    RepairClass.RECEIPT_LOST: transition("repair_receipt_lost"),
    RepairClass.REJECTED: transition("repair_rejected"),
    RepairClass.RETRY: transition("repair_resend"),
    RepairClass.EXHAUSTED: transition("repair_exhausted"),
    RepairClass.STUCK_SENDING: transition("repair_stuck_sending"),
}


@dataclasses.dataclass
class RepairCount:
    """Rows a class meant to change versus rows the compare-and-set actually changed."""

    intended: int = 0
    applied: int = 0

    @property
    def conflicts(self) -> int:
        """Rows that moved between read and write (left untouched)."""
        return self.intended - self.applied


@dataclasses.dataclass
class RepairResult:
    """Counts per class, plus the ids that conflicted and the receipt rows inserted."""

    counts: dict[RepairClass, RepairCount] = dataclasses.field(default_factory=dict)
    conflict_ids: list[tuple[RepairClass, int, str]] = dataclasses.field(default_factory=list)
    receipts_inserted: int = 0
    statements: int = 0

    def add(self, other: RepairResult, *, conflict_sample: int = 100) -> None:
        """Add another applier's result (one per producer database of a sharded run)."""
        for klass, count in other.counts.items():
            mine = self.counts.setdefault(klass, RepairCount())
            mine.intended += count.intended
            mine.applied += count.applied
        room = max(0, conflict_sample - len(self.conflict_ids))
        self.conflict_ids.extend(other.conflict_ids[:room])
        self.receipts_inserted += other.receipts_inserted
        self.statements += other.statements


class RepairApplier:
    """Apply decisions as batched compare-and-set updates (nothing is written when `dry_run`).

    >>> applier = RepairApplier(engine, outbox="ckit_outbox", receipts="ckit_outbox_receipt",
    ...                         now=utcnow(), dry_run=False)          # doctest: +SKIP
    >>> for d in decisions: applier.add(d)                            # doctest: +SKIP
    >>> result = applier.finish()                                     # doctest: +SKIP
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        outbox: str,
        receipts: str,
        now: dt.datetime,
        dry_run: bool,
        batch_size: int = DEFAULT_BATCH_SIZE,
        conflict_sample: int = 100,
    ) -> None:
        metadata = sa.MetaData()
        self._engine = engine
        self._outbox = outbox_table(metadata, outbox)
        self._receipts = receipt_table(metadata, receipts)
        self._now = now
        self._dry_run = dry_run
        self._batch_size = batch_size
        self._conflict_sample = conflict_sample
        self._buffers: dict[tuple[RepairClass, int, int], list[Decision]] = defaultdict(list)
        self.result = RepairResult()

    def add(self, decision: Decision) -> None:
        """Queue one decision; report-only classes are ignored. Flushes full batches."""
        if not decision.klass.repairs:
            return
        count = self.result.counts.setdefault(decision.klass, RepairCount())
        count.intended += 1
        if self._dry_run:
            return
        key = (decision.klass, decision.row.state, decision.row.lock_version)
        buffer = self._buffers[key]
        buffer.append(decision)
        if len(buffer) >= self._batch_size:
            self._apply(key, buffer)
            self._buffers[key] = []

    def finish(self) -> RepairResult:
        """Flush what is left and return the counts."""
        for key, buffer in list(self._buffers.items()):
            if buffer:
                self._apply(key, buffer)
        self._buffers.clear()
        return self.result

    def _apply(self, key: tuple[RepairClass, int, int], batch: list[Decision]) -> None:
        klass, expected_state, seen_version = key
        t = self._outbox
        ids = [d.row.id for d in batch]
        values = self._values(klass, batch)
        # each row by id, version and message id: a row of another database with the same id
        # and version (a --read-url paired with the wrong --url) is a conflict, never repaired
        guard = Versions([(i, seen_version) for i in ids], [d.row.message_id for d in batch])
        with self._engine.begin() as conn:
            applied = cas(conn, t, TRANSITION[klass], guard, now=self._now,
                          by=RECONCILER, sources=[OutboxState(expected_state)], values=values)
            self.result.statements += 1
            mine = set(ids)
            if applied != len(ids):
                mine = self._applied_ids(conn, klass, batch, seen_version)
                applied = len(mine)
            if klass is RepairClass.RECEIPT_LOST:
                self._insert_receipts(conn, [d for d in batch if d.row.id in mine])
        self.result.counts[klass].applied += applied
        if applied != len(ids):
            for d in batch:
                if d.row.id not in mine:
                    log.warning("reconcile conflict: message_id=%s id=%s class=%s moved since "
                                "read (its state, version or message changed); left untouched",
                                d.row.message_id, d.row.id, klass.value)
                    if len(self.result.conflict_ids) < self._conflict_sample:
                        self.result.conflict_ids.append((klass, d.row.id, d.row.message_id))
        log.debug("reconcile batch class=%s lock_version=%s applied %s/%s",
                  klass.value, seen_version, applied, len(ids))

    def _values(self, klass: RepairClass, batch: list[Decision]) -> dict[str, Any]:
        t = self._outbox
        values: dict[str, Any] = {}
        if klass is RepairClass.RECEIPT_LOST:
            values["consumed_at"] = self._now
        elif klass in (RepairClass.REJECTED, RepairClass.EXHAUSTED, RepairClass.RETRY):
            values["fail_reason"] = per_row(t.c.id, {d.row.id: d.reason for d in batch})
            if klass is RepairClass.RETRY:
                values["retry_count"] = t.c.retry_count + 1
                values["next_retry_at"] = self._now
        elif klass is RepairClass.STUCK_SENDING:
            values.update(next_retry_at=self._now, lease_owner=None, lease_until=None)
        return values

    def _applied_ids(self, conn: sa.Connection, klass: RepairClass, batch: list[Decision],
                     seen: int) -> set[int]:
        t = self._outbox
        wanted = {d.row.id: d.row.message_id for d in batch}
        stmt = sa.select(t.c.id, t.c.message_id).where(
            t.c.id.in_(list(wanted)),
            t.c.state == int(TRANSITION[klass].target),
            t.c.lock_version == seen + 1,
            t.c.updated_by == RECONCILER,
            t.c.gmt_modified == self._now,
        )
        return {i for i, m in conn.execute(stmt) if wanted[i] == m}

    def _insert_receipts(self, conn: sa.Connection, applied: list[Decision]) -> None:
        rows = [
            {"message_id": d.row.message_id, "consumer_group": group,
             "outcome": ReceiptOutcome.CONSUMED.value, "reason": None, "received_at": self._now}
            for d in applied for group in d.missing_receipts
        ]
        if not rows:
            return
        self.result.receipts_inserted += insert_new(conn, self._receipts, rows)
        # a group's older rejected receipt (its processed row says SUCCEEDED: `classify`) is
        # replaced, as the receipt applier replaces one: `archive --expect` waits for consumed
        by_group: dict[str, list[str]] = {}
        for d in applied:
            for group in d.missing_receipts:
                by_group.setdefault(group, []).append(d.row.message_id)
        a = self._receipts
        for group, ids in by_group.items():
            conn.execute(sa.update(a).where(
                a.c.consumer_group == group, a.c.message_id.in_(ids),
                a.c.outcome == ReceiptOutcome.REJECTED.value,
            ).values(outcome=ReceiptOutcome.CONSUMED.value, reason=None, received_at=self._now))
