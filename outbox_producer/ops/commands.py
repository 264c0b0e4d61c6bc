"""Operator moves of outbox rows: `retry`, `suspend`, `resume` (`ckit outbox ...`).

Each requested row is read, checked, then moved with the state machine's compare-and-set
(`consumer_kit.core.transitions.cas`, transitions `retry`, `suspend`, `resume`), one row at a
time at the `lock_version` we read: a row that a relay, the receipt applier or the reconciler
moved between our read and our write is reported as a conflict, never overwritten. Targets are
read the same way by every command (`outbox_producer.ops.resolve`).

Decisions (documented for operators in `ckit outbox --help` and docs/operations.md):

* `retry` re-queues FAILED, SUSPENDED and REJECTED rows (plus SENT and CONSUMED with `force`):
  state PENDING, `retry_count` 0, `next_retry_at` now, lease cleared. `fail_reason` is kept,
  prefixed with `operator retry (was STATE): ` so the last error stays visible until the next
  send attempt overwrites it. The message's receipt rows are deleted in the same transaction:
  the re-send starts its delivery over and the receipts it gets decide. The re-send carries
  `ckit_resend=1`, so a group that processed it already answers with a receipt again, and a
  group that rejected it runs its handler again.
* `suspend` holds PENDING, FAILED and SENDING-with-an-expired-lease rows; a live lease is refused.
* `resume` puts SUSPENDED rows back to PENDING, due now, keeping `retry_count`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import check_tables
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import REASON_LEN
from consumer_kit.core.states import OutboxState, Transition, transition
from consumer_kit.core.transitions import Ids, cas
from outbox_producer.ops.resolve import one
from outbox_producer.ops.tables import OutboxTables

OPERATOR = "operator"
RETRY_PREFIX = "operator retry"
DEFAULT_BULK_LIMIT = 1000

#: Why a row may not change (None: it may): `(row, state, now) -> reason`.
Refuse = Callable[[Any, OutboxState, dt.datetime], str | None]
#: The extra columns to set: `(row, state, now) -> values`.
Values = Callable[[Any, OutboxState, dt.datetime], dict[str, Any]]
#: Run after a row changed, in the same transaction: `(conn, row) -> None`.
After = Callable[[Connection, Any], None]


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why one requested row was not changed."""

    target: int | str
    state: str | None
    reason: str


@dataclasses.dataclass
class TransitionResult:
    """Outcome of `retry`/`suspend`/`resume`: the ids changed and the targets refused."""

    action: str
    changed: list[int] = dataclasses.field(default_factory=list)
    refused: list[Refusal] = dataclasses.field(default_factory=list)

    @property
    def conflicts(self) -> int:
        """Rows that moved between our read and our compare-and-set."""
        return sum(1 for r in self.refused if r.reason.startswith("conflict"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def _move(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str] | int | str,
    *,
    step: Transition,
    values: Values,
    sources: Sequence[OutboxState] | None = None,
    force: bool = False,
    refuse: Refuse | None = None,
    after: After | None = None,
    also_needs: Sequence[sa.Table] = (),
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Read every target, then move each one that `step` accepts; `after` runs for each moved
    row in the same transaction (on `also_needs` tables). One `str` or `int` is one target (a
    string is not read as one target per character)."""
    check_tables(engine, table, *also_needs)
    now = now or utcnow()
    wanted = list(dict.fromkeys([targets] if isinstance(targets, str | int) else targets))
    allowed = tuple(sources or step.allowed_from(force=force))
    result = TransitionResult(step.name)
    c = table.c
    cols = (c.id, c.message_id, c.state, c.lock_version, c.lease_until, c.lease_owner,
            c.fail_reason)
    with engine.connect() as conn:
        rows = {t: one(conn, table, f"id:{t}" if isinstance(t, int) else str(t), cols)
                for t in wanted}
    seen: set[int] = set()
    with engine.begin() as conn:
        for target in wanted:
            row = rows[target]
            if row is None:
                result.refused.append(Refusal(target, None, "not found"))
                continue
            if row.id in seen:  # named twice (`4 id:4`): moved once, not a conflict
                continue
            seen.add(row.id)
            state = OutboxState(row.state)
            why = refuse(row, state, now) if refuse else None
            if why is None and state not in allowed:
                why = f"{step.name} needs {'/'.join(s.name for s in allowed)}, row is {state.name}"
            if why is not None:
                result.refused.append(Refusal(target, state.name, why))
                continue
            moved = cas(conn, table, step, Ids([int(row.id)], row.lock_version), now=now,
                        by=OPERATOR, sources=[state], force=force,
                        values=values(row, state, now))
            if moved == 1:
                if after is not None:
                    after(conn, row)
                result.changed.append(int(row.id))
            else:
                result.refused.append(
                    Refusal(target, state.name, "conflict: the row changed meanwhile; try again"))
    return result


def _retry_reason(previous: str | None, state: OutboxState) -> str | None:
    if previous is None:
        return None
    if previous.startswith(RETRY_PREFIX) and "): " in previous:
        previous = previous.split("): ", 1)[1]
    return f"{RETRY_PREFIX} (was {state.name}): {previous}"[:REASON_LEN]


def retry_states(
    states: Sequence[OutboxState] | None = None, *, force: bool = False
) -> tuple[OutboxState, ...]:
    """The states `retry` accepts: `states` (default: all it may retry), checked against the
    `retry` transition's sources (and its forced ones with `force`).

    Raises:
        ConfigError: a state cannot be retried (PENDING, SENDING), or needs `force` (SENT,
            CONSUMED); the message names the valid ones.
    """
    valid = transition("retry").allowed_from(force=force)
    if states is None:
        return valid
    bad = ", ".join(s.name for s in states if s not in valid)
    if bad:
        forced = transition("retry").forced
        hint = "" if force else f"; {', '.join(s.name for s in forced)} with --force"
        raise ConfigError(f"cannot retry {bad} rows (valid: "
                         f"{', '.join(s.name for s in valid)}{hint})")
    return tuple(dict.fromkeys(states))


def retry(
    engine: Engine,
    tables: OutboxTables,
    targets: Iterable[int | str] | int | str,
    *,
    states: Sequence[OutboxState] | None = None,
    force: bool = False,
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Put rows back to PENDING, due now, with `retry_count` 0, and delete their receipt rows in
    the same transaction (see the module doc for the fields).

    `targets` are row ids (int) or arguments as `outbox_producer.ops.resolve` reads them (one
    of them alone is one target). Rows must be in `states`: by default
    FAILED, SUSPENDED and REJECTED, plus SENT and CONSUMED with `force=True`; SENT and CONSUMED
    need `force` whatever `states` says.

    Raises:
        ConfigError: `states` names a state that cannot be retried (PENDING, SENDING), or SENT
            or CONSUMED without `force`.
        AmbiguousTarget: an argument matches rows in more than one way.
        SchemaError: a table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.

    >>> retry(engine, tables, ["01HV..."])  # doctest: +SKIP
    """
    allowed = retry_states(states, force=force)
    receipts = tables.receipts
    forced = transition("retry").forced

    def refuse(_row: Any, state: OutboxState, _now: dt.datetime) -> str | None:
        if state in forced and not force:
            return f"{state.name} rows are re-sent only with --force"
        return None

    def drop_receipts(conn: Connection, row: Any) -> None:
        conn.execute(sa.delete(receipts).where(receipts.c.message_id == row.message_id))

    return _move(
        engine, tables.outbox, targets, step=transition("retry"), sources=allowed, force=force,
        refuse=refuse, after=drop_receipts, also_needs=[receipts], now=now,
        values=lambda row, state, now: {
            "retry_count": 0, "next_retry_at": now, "lease_owner": None, "lease_until": None,
            "fail_reason": _retry_reason(row.fail_reason, state),
            # SENT, CONSUMED and REJECTED rows went out before: the re-send must say so
            # (`ckit_resend`), also for rows whose receipt beat the sender's mark (older
            # versions left their `sent_at` empty)
            **({"sent_at": sa.func.coalesce(tables.outbox.c.sent_at, now)}
               if state in _WENT_OUT else {}),
        },
    )  # fmt: skip


#: states a row reaches only after a send went out
_WENT_OUT = frozenset({OutboxState.SENT, OutboxState.CONSUMED, OutboxState.REJECTED})


def suspend(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str] | int | str,
    *,
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Hold PENDING, FAILED and SENDING-with-an-expired-lease rows in SUSPENDED.

    Raises:
        SchemaError: the table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """

    def refuse(row: Any, state: OutboxState, now: dt.datetime) -> str | None:
        if state is OutboxState.SENDING and row.lease_until is not None and row.lease_until > now:
            return f"SENDING under a live lease of {row.lease_owner} until {row.lease_until}"
        return None

    return _move(
        engine, table, targets, step=transition("suspend"), refuse=refuse, now=now,
        values=lambda row, state, now: {"lease_owner": None, "lease_until": None},
    )  # fmt: skip


def resume(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str] | int | str,
    *,
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Put SUSPENDED rows back to PENDING, due now (`retry_count` kept).

    Raises:
        SchemaError: the table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    return _move(
        engine, table, targets, step=transition("resume"), now=now,
        values=lambda row, state, now: {"next_retry_at": now},
    )  # fmt: skip


def select_ids(
    engine: Engine,
    table: sa.Table,
    *,
    states: Sequence[OutboxState],
    topic: str | None = None,
    limit: int = DEFAULT_BULK_LIMIT,
) -> list[int]:
    """Ids of up to `limit` rows in `states` (and `topic`), oldest first: the bulk forms' input.

    Raises:
        ConfigError: `limit` is not positive.
        SchemaError: the table is missing.
    """
    if limit <= 0:
        raise ConfigError(f"--limit must be positive, got {limit}")
    check_tables(engine, table)
    c = table.c
    query = sa.select(c.id).where(c.state.in_([int(s) for s in states]))
    if topic is not None:
        query = query.where(c.topic == topic)
    with engine.connect() as conn:
        return [int(i) for i in conn.scalars(query.order_by(c.id).limit(limit))]


