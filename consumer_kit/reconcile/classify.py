"""The reconciler's rules: one pure function from a window row and its evidence to a decision.

Both engines call `classify`; nothing else in the package decides what a row is.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from consumer_kit.core.clock import duration_text
from consumer_kit.core.receipt import ReceiptOutcome
from consumer_kit.core.schema import REASON_LEN, ProcessedStatus
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile.model import (
    DEDUPE_HORIZON,
    Decision,
    Evidence,
    GroupSource,
    RepairClass,
    WindowRow,
)


def classify(
    row: WindowRow,
    evidence: Iterable[Evidence],
    groups: Sequence[GroupSource],
    *,
    max_retries: int | None = None,
    horizon: dt.timedelta = DEDUPE_HORIZON,
) -> Decision:
    """Classify one outbox row of the window.

    `groups` are every configured group; only those expecting the row's topic count. `evidence`
    may hold rows of other groups (ignored). `max_retries` overrides the row's own `max_retries`.

    Rules, in order: a SENDING row (its lease expired before the cutoff) is STUCK_SENDING; a SENT
    row with no expected group is UNMATCHED; any expected group that FAILED it (processed FAILED
    or sent a rejected receipt, unless its processed row says SUCCEEDED: that row is the truth,
    the receipt older) makes it REJECTED; every expected group SUCCEEDED (processed) or
    sent a consumed receipt makes it RECEIPT_LOST; otherwise some group is missing: RETRY while
    `retry_count < max_retries` (BEYOND_DEDUPE instead, report only, for a row made before
    `DEDUPE_HORIZON`: its processed rows may be purged, a re-send could apply twice), else
    EXHAUSTED.

    >>> row = WindowRow(id=1, message_id="m1", topic="T", state=2, retry_count=0,
    ...                 max_retries=3, lock_version=4)
    >>> classify(row, [], [GroupSource("g", "sqlite://")]).klass
    <RepairClass.RETRY: 'retry'>
    """
    if row.state == OutboxState.SENDING:
        return Decision(row=row, klass=RepairClass.STUCK_SENDING,
                        reason=f"lease expired at {row.lease_until}")
    expected = [g.name for g in groups if g.expects(row.topic)]
    if not expected:
        return Decision(row=row, klass=RepairClass.UNMATCHED,
                        reason=f"no configured consumer group consumes topic {row.topic!r}")
    by_group: dict[str, Evidence] = {}
    for ev in evidence:
        if ev.group in expected:
            by_group[ev.group] = _merge(by_group.get(ev.group), ev)

    rejected = [_rejection(by_group[g]) for g in expected if g in by_group]
    reasons = [r for r in rejected if r is not None]
    if reasons:
        return Decision(row=row, klass=RepairClass.REJECTED, reason=_truncate("; ".join(reasons)))

    consumed = [g for g in expected if g in by_group and _consumed(by_group[g])]
    missing = tuple(g for g in expected if g not in consumed)
    if not missing:
        missing_receipts = tuple(g for g in expected if by_group[g].receipt_outcome
                                 != ReceiptOutcome.CONSUMED.value)
        return Decision(row=row, klass=RepairClass.RECEIPT_LOST, missing_receipts=missing_receipts)

    limit = row.max_retries if max_retries is None else max_retries
    if row.retry_count < limit and row.before_horizon:
        return Decision(row=row, klass=RepairClass.BEYOND_DEDUPE, groups_missing=missing,
                        reason=_truncate(
                            f"not consumed by {', '.join(missing)}, made over "
                            f"{duration_text(horizon)} ago (--dedupe-horizon): its processed "
                            "rows may be purged, a re-send could apply it twice; not re-sent"))
    if row.retry_count < limit:
        return Decision(row=row, klass=RepairClass.RETRY, groups_missing=missing,
                        reason=_truncate(f"not consumed by {', '.join(missing)}; re-send "
                                         f"{row.retry_count + 1}/{limit}"))
    return Decision(
        row=row, klass=RepairClass.EXHAUSTED, groups_missing=missing,
        reason=_truncate(f"reconciler: not consumed by {', '.join(missing)} after "
                         f"{row.retry_count} retries (max {limit})"),
    )


def _merge(old: Evidence | None, new: Evidence) -> Evidence:
    if old is None:
        return new
    return Evidence(
        group=new.group,
        processed_status=new.processed_status or old.processed_status,
        processed_error=new.processed_error or old.processed_error,
        receipt_outcome=new.receipt_outcome or old.receipt_outcome,
        receipt_reason=new.receipt_reason or old.receipt_reason,
    )


def _rejection(ev: Evidence) -> str | None:
    if ev.processed_status == ProcessedStatus.SUCCEEDED.value:
        # the group's own row is the truth: a rejected receipt beside it is older (answered
        # before a re-send the group then ran, e.g. after `ckit outbox retry`)
        return None
    if ev.processed_status in (ProcessedStatus.FAILED.value,
                               ProcessedStatus.DEAD_LETTERED.value):
        return f"{ev.group}: {ev.processed_error or 'processing failed'}"
    if ev.receipt_outcome == ReceiptOutcome.REJECTED.value:
        return f"{ev.group}: {ev.receipt_reason or 'rejected'}"
    return None


def _consumed(ev: Evidence) -> bool:
    return (ev.processed_status == ProcessedStatus.SUCCEEDED.value
            or ev.receipt_outcome == ReceiptOutcome.CONSUMED.value)


def _truncate(text: str) -> str:
    return text if len(text) <= REASON_LEN else text[: REASON_LEN - 3] + "..."
