"""Applying consumer acks to the outbox: per-group ack rows, then CONSUMED or REJECTED.

An ack names `(message_id, consumer_group, outcome)`. Acks are stored per group, so one message
can be tracked for several consumer groups; the outbox row becomes CONSUMED when every group
expected for its topic has acked (any one group when none are configured) and REJECTED when a
group rejects it. The row may still be PENDING or SENDING when the ack arrives (the ack raced
the relay's mark): it becomes CONSUMED all the same, and the relay's later mark finds nothing
to change.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.clock import utcnow
from consumer_kit.db import make_engine, read_committed
from consumer_kit.schema import (
    DEFAULT_ACK_TABLE,
    DEFAULT_OUTBOX_TABLE,
    GROUP_LEN,
    MESSAGE_ID_LEN,
    OPEN_STATES,
    REASON_LEN,
    AckOutcome,
    OutboxState,
    ack_table,
    outbox_table,
)
from outbox_producer import metrics
from outbox_producer.errors import AckError

log = logging.getLogger("consumer_kit.outbox.acks")

ACK_TOPIC_PREFIX = "ckit-ack-"


def ack_topic(producer: str) -> str:
    """The topic a producer's acks travel on: `ckit-ack-<producer>`."""
    return f"{ACK_TOPIC_PREFIX}{producer}"


@dataclasses.dataclass(frozen=True)
class Ack:
    """One consumer group's answer for one message."""

    message_id: str
    consumer_group: str
    outcome: AckOutcome = AckOutcome.CONSUMED
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.message_id or len(self.message_id) > MESSAGE_ID_LEN:
            raise AckError(f"ack has an invalid message id {self.message_id!r}")
        if not self.consumer_group or len(self.consumer_group) > GROUP_LEN:
            raise AckError(f"ack has an invalid consumer group {self.consumer_group!r}")
        object.__setattr__(self, "outcome", AckOutcome(self.outcome))


def encode_acks(acks: Iterable[Ack]) -> bytes:
    """The body of an ack-topic message: a JSON list (one message carries a batch)."""
    return json.dumps([
        {"id": a.message_id, "group": a.consumer_group, "outcome": a.outcome.value,
         **({"reason": a.reason} if a.reason else {})}
        for a in acks
    ], separators=(",", ":")).encode()


def decode_acks(body: bytes) -> list[Ack]:
    """Parse an ack-topic message body.

    Raises:
        AckError: the body is not a JSON list of acks (the message says what is wrong).
    """
    try:
        items = json.loads(body)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return [Ack(str(i["id"]), str(i["group"]), AckOutcome(i.get("outcome", "consumed")),
                    i.get("reason")) for i in items]
    except (ValueError, TypeError, KeyError) as exc:
        raise AckError(f"malformed ack message: {type(exc).__name__}: {exc}") from None


@dataclasses.dataclass
class AckResult:
    """Counts of one `apply` call."""

    received: int = 0
    recorded: int = 0
    consumed: int = 0
    rejected: int = 0
    unknown: int = 0

    def add(self, other: AckResult) -> None:
        """Accumulate another call's counts."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class AckApplier:
    """Applies batches of acks to one outbox.

    >>> applier = AckApplier(engine, expected_groups={"ORDER_CREATED": ["inventory", "billing"]})
    ... # doctest: +SKIP
    >>> applier.apply([Ack(message_id, "inventory")])                   # doctest: +SKIP
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        ack_table_name: str = DEFAULT_ACK_TABLE,
        expected_groups: Mapping[str, Sequence[str]] | None = None,
        updated_by: str = "acks",
    ) -> None:
        self.engine = read_committed(make_engine(engine))
        metadata = sa.MetaData()
        self.table = outbox_table(metadata, table)
        self.acks = ack_table(metadata, ack_table_name)
        self.expected = {topic: frozenset(groups) for topic, groups in
                         (expected_groups or {}).items()}
        self.updated_by = updated_by

    def apply(self, acks: Sequence[Ack]) -> AckResult:
        """Record the acks and move the affected rows, in one transaction."""
        result = AckResult(received=len(acks))
        if not acks:
            return result
        latest: dict[tuple[str, str], Ack] = {}
        for ack in acks:
            latest[(ack.message_id, ack.consumer_group)] = ack
        with self.engine.begin() as conn:
            result.recorded = self._record(conn, list(latest.values()))
            self._transition(conn, {a.message_id for a in latest.values()}, result)
        metrics.ACKS.labels("consumed").inc(result.consumed)
        metrics.ACKS.labels("rejected").inc(result.rejected)
        return result

    def _record(self, conn: Connection, acks: list[Ack]) -> int:
        a = self.acks
        ids = sorted({ack.message_id for ack in acks})
        seen = {(m, g) for m, g in conn.execute(
            sa.select(a.c.message_id, a.c.consumer_group).where(a.c.message_id.in_(ids)))}
        now = utcnow()
        fresh = [{"message_id": ack.message_id, "consumer_group": ack.consumer_group,
                  "outcome": ack.outcome.value, "reason": (ack.reason or None) and
                  ack.reason[:REASON_LEN], "acked_at": now}
                 for ack in acks if (ack.message_id, ack.consumer_group) not in seen]
        if fresh:
            conn.execute(sa.insert(a), fresh)
        return len(fresh)

    def _transition(self, conn: Connection, message_ids: set[str], result: AckResult) -> None:
        t, a = self.table, self.acks
        ids = sorted(message_ids)
        rows = conn.execute(
            sa.select(t.c.message_id, t.c.topic, t.c.state).where(t.c.message_id.in_(ids))
        ).all()
        result.unknown = len(ids) - len(rows)
        acked: dict[str, dict[str, Any]] = {}
        for mid, group, outcome, reason in conn.execute(
            sa.select(a.c.message_id, a.c.consumer_group, a.c.outcome, a.c.reason)
            .where(a.c.message_id.in_(ids))
        ):
            acked.setdefault(mid, {})[group] = (outcome, reason)
        to_consume: list[str] = []
        to_reject: list[tuple[str, str]] = []
        for mid, topic, state in rows:
            if state not in OPEN_STATES:
                continue
            groups = acked.get(mid, {})
            rejects = [f"{g}: {r or 'rejected'}" for g, (o, r) in groups.items()
                       if o == AckOutcome.REJECTED.value]
            if rejects:
                to_reject.append((mid, "; ".join(sorted(rejects))))
                continue
            expected = self.expected.get(topic)
            if (expected and expected <= groups.keys()) or (not expected and groups):
                to_consume.append(mid)
        now = utcnow()
        open_states = [int(s) for s in OPEN_STATES]
        common = {"lock_version": t.c.lock_version + 1, "gmt_modified": now,
                  "updated_by": self.updated_by, "lease_owner": None, "lease_until": None}
        if to_consume:
            # guarded by state: the decision rests on the ack rows alone (which only grow),
            # so any open state may become CONSUMED, and a terminal one never changes
            result.consumed = conn.execute(
                sa.update(t).where(t.c.message_id.in_(to_consume), t.c.state.in_(open_states))
                .values(state=int(OutboxState.CONSUMED), consumed_at=now, **common)
            ).rowcount
        for mid, reason in to_reject:
            result.rejected += conn.execute(
                sa.update(t).where(t.c.message_id == mid, t.c.state.in_(open_states))
                .values(state=int(OutboxState.REJECTED), fail_reason=reason[:REASON_LEN],
                        **common)
            ).rowcount
            log.warning("message %s REJECTED by %s", mid, reason)
