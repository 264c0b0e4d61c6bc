"""Applying consumer groups' receipts to the outbox: per-group receipt rows, then CONSUMED or
REJECTED through the state machine.

A receipt names `(message_id, consumer_group, outcome)`. Receipts are stored per group, so one
message can be tracked for several consumer groups; the outbox row becomes CONSUMED when every
group expected for its topic sent a consumed receipt (any one group when none are configured)
and REJECTED when a group rejects it (an expected group, when the topic has them: as the
reconciler decides). The row may still be PENDING or SENDING when the receipt arrives (it
raced the relay's mark): it becomes CONSUMED all the same, and the relay's later mark finds
nothing to change. Applying the same receipts twice changes nothing.

A consumer's success is the truth about its group: a consumed receipt replaces that group's
stored rejected one (the group ran the message after all: a re-send after `ckit outbox retry`
re-runs a failed message), and a REJECTED row whose groups have all consumed it becomes
CONSUMED. A rejection does not move a PENDING row that was sent before (`sent_at` set): it was
put back to be sent again (an operator's retry, the reconciler's re-send) after the delivery
that was rejected, so the answer to its re-send decides, not an older answer still on its way
(a durable receipt owed while the producer was unreachable). The rejection stays stored, for
the reconciler and the next receipt. A PENDING row never marked sent (a send whose answer was
lost, a `--claim lock` send in flight) is rejected as before.

It lives in the core because both halves apply receipts: the producer's `ckit receipts`
(from the receipt topic) and a consumer configured with the producer's database URL.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import insert_new, make_engine, read_committed
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipt import Receipt, ReceiptOutcome
from consumer_kit.core.schema import (
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_RECEIPT_TABLE,
    REASON_LEN,
    check_outbox_names,
    outbox_table,
    receipt_table,
)
from consumer_kit.core.states import OPEN_STATES, OutboxState
from consumer_kit.core.transitions import MessageIds, cas

log = logging.getLogger(__name__)

#: receipt rows per INSERT (5 bound values each: well under every database's limit)
INSERT_CHUNK = 400
#: unknown message ids named in the log per `apply` call (the rest are counted)
UNKNOWN_LOGGED = 20


@dataclasses.dataclass
class ReceiptResult:
    """Counts of one `apply` call (or many, added up)."""

    received: int = 0
    recorded: int = 0
    consumed: int = 0
    rejected: int = 0
    unknown: int = 0

    def add(self, other: ReceiptResult) -> None:
        """Accumulate another call's counts."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class ReceiptApplier:
    """Applies batches of receipts to one outbox.

    >>> applier = ReceiptApplier(engine, expected_groups={"ORDER_CREATED": ["inventory"]})
    ... # doctest: +SKIP
    >>> applier.apply([Receipt(message_id, "inventory")])               # doctest: +SKIP

    Raises:
        ConfigError: `expected_groups` gives a topic one string, or a group that is not a
            non-empty string, instead of a list of group names (a string is a sequence of its
            letters: the row would wait for groups "i", "n", "v", ... and never be CONSUMED);
            or `table`, its archive and `receipt_table_name` naming one table twice.
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        receipt_table_name: str = DEFAULT_RECEIPT_TABLE,
        expected_groups: Mapping[str, Sequence[str]] | None = None,
        updated_by: str = "receipts",
    ) -> None:
        check_outbox_names(table, receipt_table_name)
        self.engine = read_committed(make_engine(engine))
        metadata = sa.MetaData()
        self.table = outbox_table(metadata, table)
        self.receipts = receipt_table(metadata, receipt_table_name)
        self.expected = {topic: group_names(topic, groups) for topic, groups in
                         (expected_groups or {}).items()}
        self.updated_by = updated_by

    def apply(self, receipts: Sequence[Receipt]) -> ReceiptResult:
        """Record the receipts and move the affected rows, in one transaction (idempotent)."""
        result = ReceiptResult(received=len(receipts))
        if not receipts:
            return result
        latest: dict[tuple[str, str], Receipt] = {}
        for receipt in receipts:
            latest[(receipt.message_id, receipt.consumer_group)] = receipt
        with self.engine.begin() as conn:
            result.recorded = self._record(conn, list(latest.values()))
            self._transition(conn, {a.message_id for a in latest.values()}, result)
        return result

    def _record(self, conn: Connection, receipts: list[Receipt]) -> int:
        """Insert the receipt rows that are new; a row another applier inserted meanwhile is
        skipped, not an error (the database decides, no read-then-insert race). A consumed
        receipt replaces its group's stored rejected one."""
        now = utcnow()
        rows = [{"message_id": r.message_id, "consumer_group": r.consumer_group,
                 "outcome": r.outcome.value,
                 "reason": (r.reason or None) and r.reason[:REASON_LEN], "received_at": now}
                for r in receipts]
        recorded = insert_new(conn, self.receipts, rows, chunk=INSERT_CHUNK)
        consumed: dict[str, list[str]] = {}
        for r in receipts:
            if r.outcome is ReceiptOutcome.CONSUMED:
                consumed.setdefault(r.consumer_group, []).append(r.message_id)
        a = self.receipts
        for group, ids in consumed.items():
            for start in range(0, len(ids), INSERT_CHUNK):
                replaced = conn.execute(
                    sa.update(a).where(a.c.consumer_group == group,
                                       a.c.message_id.in_(ids[start:start + INSERT_CHUNK]),
                                       a.c.outcome == ReceiptOutcome.REJECTED.value)
                    .values(outcome=ReceiptOutcome.CONSUMED.value, reason=None,
                            received_at=now)
                    .execution_options(preserve_rowcount=True)).rowcount
                if replaced > 0:
                    recorded += int(replaced)
                    log.info("%d rejected receipt(s) of group %s replaced by consumed ones",
                             replaced, group)
        return recorded

    def _transition(self, conn: Connection, message_ids: set[str], result: ReceiptResult) -> None:
        t, a = self.table, self.receipts
        ids = sorted(message_ids)
        rows = conn.execute(
            sa.select(t.c.message_id, t.c.topic, t.c.state, t.c.sent_at)
            .where(t.c.message_id.in_(ids))
        ).all()
        result.unknown = len(ids) - len(rows)
        if result.unknown:
            found = {row.message_id for row in rows}
            missing = [mid for mid in ids if mid not in found]
            log.warning("receipts for %d message id(s) not in %s (another producer's, "
                        "another shard's of this producer: give ckit receipts every shard's "
                        "--url; or archived): %s%s", len(missing), t.name,
                        ", ".join(missing[:UNKNOWN_LOGGED]),
                        " ..." if len(missing) > UNKNOWN_LOGGED else "")
        acked: dict[str, dict[str, Any]] = {}
        for mid, group, outcome, reason in conn.execute(
            sa.select(a.c.message_id, a.c.consumer_group, a.c.outcome, a.c.reason)
            .where(a.c.message_id.in_(ids))
        ):
            acked.setdefault(mid, {})[group] = (outcome, reason)
        to_consume: list[str] = []
        to_unreject: list[str] = []
        to_reject: list[tuple[str, str]] = []
        for mid, topic, state, sent_at in rows:
            if state not in OPEN_STATES and state != OutboxState.REJECTED:
                continue
            groups = acked.get(mid, {})
            expected = self.expected.get(topic)
            rejects = [f"{g}: {r or 'rejected'}" for g, (o, r) in groups.items()
                       if o == ReceiptOutcome.REJECTED.value and (not expected or g in expected)]
            if rejects:
                if state == OutboxState.PENDING and sent_at is not None:
                    log.info("message %s: rejected (%s) by an earlier delivery; it was put back "
                             "to be sent again since, so its re-send's answer decides", mid,
                             "; ".join(sorted(rejects)))
                elif state != OutboxState.REJECTED:
                    to_reject.append((mid, "; ".join(sorted(rejects))))
                continue
            consumed = {g for g, (o, _) in groups.items() if o == ReceiptOutcome.CONSUMED.value}
            if (expected and expected <= consumed) or (not expected and consumed):
                (to_unreject if state == OutboxState.REJECTED else to_consume).append(mid)
        now = utcnow()
        # a receipt proves the message went out: when it beat the sender's mark (SENDING ->
        # CONSUMED), `sent_at` is set here, so a later re-send (`ckit outbox retry --force`)
        # carries `ckit_resend` and the groups that processed it answer with a receipt again
        done = {"lease_owner": None, "lease_until": None,
                "sent_at": sa.func.coalesce(t.c.sent_at, now)}
        if to_consume:
            # the decision rests on the receipt rows alone (which only grow), so any open state
            # may become CONSUMED; of the terminal ones only REJECTED may, by `consume_rejected`
            result.consumed = cas(conn, t, "consume", MessageIds(to_consume), now=now,
                                  by=self.updated_by, values={"consumed_at": now, **done})
        if to_unreject:
            moved = cas(conn, t, "consume_rejected", MessageIds(to_unreject), now=now,
                        by=self.updated_by, values={"consumed_at": now, **done})
            result.consumed += moved
            if moved:
                log.warning("%d REJECTED message(s) CONSUMED: the groups that rejected them "
                            "consumed a later delivery (%s)", moved,
                            ", ".join(to_unreject[:UNKNOWN_LOGGED]))
        for mid, reason in to_reject:
            result.rejected += cas(conn, t, "reject", MessageIds([mid]), now=now,
                                   by=self.updated_by,
                                   values={"fail_reason": reason[:REASON_LEN], **done})
            log.warning("message %s REJECTED by %s", mid, reason)


def group_names(topic: str, groups: Sequence[str], *, what: str = "expected_groups"
                ) -> frozenset[str]:
    """The consumer groups expected for `topic`, checked: a list (or any iterable) of non-empty
    names, never one string, which would be read as its letters.

    Raises:
        ConfigError: naming `what` (the argument) and the topic.
    """
    items = None if isinstance(groups, str | bytes) else list(groups)
    if items is None or not all(isinstance(g, str) and g for g in items):
        raise ConfigError(f"{what} for topic {topic!r} must be a list of consumer "
                          f"group names, not {groups!r}")
    return frozenset(items)
