"""`cas`: the one guarded compare-and-set every outbox writer uses to change a row's state.

    UPDATE outbox SET state = :target, lock_version = lock_version + 1, gmt_modified = :now,
                      updated_by = :by, ...
     WHERE <which rows> AND state IN (:the transition's sources)

`which rows` is one of the `Guard`s below: `(id, lock_version)` pairs (a sender holding its
claim), ids at one seen `lock_version` (operator, reconciler), message ids (receipts, whose
decision rests on receipt rows that only grow), or a condition (a claim's due rows). The caller
checks the returned row count: a row that moved meanwhile is a conflict, never overwritten.
Each statement carries the execution option `ckit_transition` (its name), so a test can check
that every UPDATE of the outbox went through here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.states import OutboxState, Transition, transition

#: Rows per statement for pair and id guards (well under every database's parameter limits).
CHUNK = 500
#: The execution option naming the transition of an outbox UPDATE (checked by the tests).
OPTION = "ckit_transition"


@dataclasses.dataclass(frozen=True)
class Versions:
    """Rows given as `(id, lock_version)` pairs: each must still be at that version."""

    pairs: Sequence[tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Ids:
    """Rows given by id, all read at `lock_version` (None: any version)."""

    ids: Sequence[int]
    lock_version: int | None = None


@dataclasses.dataclass(frozen=True)
class MessageIds:
    """Rows given by message id, at any version (the state guard alone decides)."""

    message_ids: Sequence[str]


@dataclasses.dataclass(frozen=True)
class Where:
    """Rows matching a condition (a claim's due rows, already chosen by the caller)."""

    clauses: Sequence[sa.ColumnElement[bool]]


Guard = Versions | Ids | MessageIds | Where


def cas(
    conn: Connection,
    table: sa.Table,
    move: Transition | str,
    guard: Guard,
    *,
    now: dt.datetime,
    by: str | None = None,
    values: Mapping[str, Any] | None = None,
    sources: Iterable[OutboxState] | None = None,
    force: bool = False,
) -> int:
    """Apply transition `move` to the rows of `guard` that are in one of its source states;
    return how many rows changed.

    `sources` narrows the transition's source states (it may not widen them); `force` admits
    its forced sources (operator `--force`). `values` are further columns to set (expressions
    allowed); `by` is written to `updated_by` (default: the transition's actor).

    Raises:
        ConfigError: `sources` names a state the transition does not accept (a programming
            error: the transition table is the law).
    """
    step = transition(move) if isinstance(move, str) else move
    allowed = step.allowed_from(force=force)
    states = tuple(allowed if sources is None else dict.fromkeys(sources))
    outside = [s.name for s in states if s not in allowed]
    if outside:
        raise ConfigError(
            f"transition {step.name} does not move rows out of {', '.join(outside)}")
    c = table.c
    state_guard = (c.state == int(states[0]) if len(states) == 1
                   else c.state.in_([int(s) for s in states]))
    sets: dict[str, Any] = {
        "state": int(step.target), "lock_version": c.lock_version + 1, "gmt_modified": now,
        "updated_by": (by or step.actor.value)[:128], **(values or {}),
    }
    changed = 0
    for which in _row_guards(table, guard):
        stmt = (sa.update(table).where(which, state_guard).values(**sets)
                .execution_options(**{OPTION: step.name}))
        changed += conn.execute(stmt).rowcount
    return changed


def _row_guards(table: sa.Table, guard: Guard) -> list[sa.ColumnElement[bool]]:
    c = table.c
    if isinstance(guard, Versions):
        return [sa.tuple_(c.id, c.lock_version).in_(list(guard.pairs[i:i + CHUNK]))
                for i in range(0, len(guard.pairs), CHUNK)]
    if isinstance(guard, Ids):
        out = []
        for i in range(0, len(guard.ids), CHUNK):
            chunk = list(guard.ids[i:i + CHUNK])
            cond = c.id == chunk[0] if len(chunk) == 1 else c.id.in_(chunk)
            if guard.lock_version is not None:
                cond = sa.and_(cond, c.lock_version == guard.lock_version)
            out.append(cond)
        return out
    if isinstance(guard, MessageIds):
        return [c.message_id.in_(list(guard.message_ids[i:i + CHUNK]))
                for i in range(0, len(guard.message_ids), CHUNK)]
    return [sa.and_(*guard.clauses)]


def per_row(id_column: sa.ColumnElement[Any], by_id: Mapping[int, Any]) -> Any:
    """One bound value when every row gets the same, else `CASE id WHEN :id THEN :v ... END`
    (per-row values in one statement: broker ids, reasons)."""
    distinct = set(by_id.values())
    if len(distinct) == 1:
        return next(iter(distinct))
    return sa.case(dict(by_id), value=id_column)
