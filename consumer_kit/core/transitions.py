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
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.states import OutboxState, Transition, transition

#: Rows per statement for pair and id guards (well under every database's parameter limits).
CHUNK = 2000
#: The execution option naming the transition of an outbox UPDATE (checked by the tests).
OPTION = "ckit_transition"


@dataclasses.dataclass(frozen=True)
class Versions:
    """Rows given as `(id, lock_version)` pairs: each must still be at that version. With
    `message_ids` (one per pair) each must also still hold that message: an id handed out
    again (a rolled-back row's, on SQLite) never matches another message's row."""

    pairs: Sequence[tuple[int, int]]
    message_ids: Sequence[str] | None = None


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
    changed = 0
    for stmt in _statements(table, move, guard, now=now, by=by, values=values,
                            sources=sources, force=force):
        changed += conn.execute(stmt).rowcount
    return changed


def cas_returning(
    conn: Connection,
    table: sa.Table,
    move: Transition | str,
    guard: Guard,
    *,
    returning: Sequence[sa.ColumnElement[Any]],
    now: dt.datetime,
    by: str | None = None,
    values: Mapping[str, Any] | None = None,
) -> list[Any]:
    """`cas` that returns the `returning` columns of the rows it changed, as they are after the
    change (UPDATE ... RETURNING: PostgreSQL and SQLite; one statement claims and reads)."""
    found: list[Any] = []
    for stmt in _statements(table, move, guard, now=now, by=by, values=values):
        found += conn.execute(stmt.returning(*returning)).all()
    return found


def _statements(table: sa.Table, move: Transition | str, guard: Guard, *, now: dt.datetime,
                by: str | None, values: Mapping[str, Any] | None,
                sources: Iterable[OutboxState] | None = None, force: bool = False
                ) -> list[sa.Update]:
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
    return [sa.update(table).where(which, state_guard).values(**sets)
            .execution_options(**{OPTION: step.name}) for which in _row_guards(table, guard)]


def _row_guards(table: sa.Table, guard: Guard) -> list[sa.ColumnElement[bool]]:
    c = table.c
    if isinstance(guard, Versions):
        pairs = list(guard.pairs)
        if guard.message_ids is None:
            return [_rows_in((c.id, c.lock_version), pairs[i:i + CHUNK])
                    for i in range(0, len(pairs), CHUNK)]
        # each row's message id through `CASE id WHEN ... END`, not a third column of the row
        # constructor: MariaDB plans `(id, lock_version, message_id) IN (...)` in time
        # quadratic in the rows (1.1 s for 1,000 spread ids; the unique message_id index is a
        # candidate), the pairs and the CASE in milliseconds. A CASE holds one message per id:
        # an id given twice (with two messages) starts a statement of its own
        out = []
        for chunk in _unique_id_chunks(pairs, guard.message_ids):
            by_id = {i: m for (i, _), m in chunk}
            out.append(sa.and_(_rows_in((c.id, c.lock_version), [p for p, _ in chunk]),
                               c.message_id == (
                                   chunk[0][1] if len(chunk) == 1
                                   else sa.case(by_id, value=c.id))))
        return out
    if isinstance(guard, Ids):
        out = []
        for i in range(0, len(guard.ids), CHUNK):
            ids = list(guard.ids[i:i + CHUNK])
            cond = c.id == ids[0] if len(ids) == 1 else c.id.in_(ids)
            if guard.lock_version is not None:
                cond = sa.and_(cond, c.lock_version == guard.lock_version)
            out.append(cond)
        return out
    if isinstance(guard, MessageIds):
        return [c.message_id.in_(list(guard.message_ids[i:i + CHUNK]))
                for i in range(0, len(guard.message_ids), CHUNK)]
    return [sa.and_(*guard.clauses)]


def _unique_id_chunks(pairs: Sequence[tuple[int, int]], message_ids: Sequence[str]
                      ) -> list[list[tuple[tuple[int, int], str]]]:
    """`pairs` with their message ids in chunks of at most `CHUNK`, no id twice in one."""
    chunks: list[list[tuple[tuple[int, int], str]]] = []
    chunk: list[tuple[tuple[int, int], str]] = []
    ids: set[int] = set()
    for pair, message_id in zip(pairs, message_ids, strict=True):
        if len(chunk) >= CHUNK or pair[0] in ids:
            chunks.append(chunk)
            chunk, ids = [], set()
        chunk.append((pair, message_id))
        ids.add(pair[0])
    if chunk:
        chunks.append(chunk)
    return chunks


def _rows_in(columns: tuple[sa.ColumnElement[Any], ...], rows: Sequence[tuple[Any, ...]]
             ) -> sa.ColumnElement[bool]:
    """`(a, b) IN ((..), (..))`, or plain equalities for one row: MariaDB reads a one-row
    row-constructor IN as a scan of the whole primary key (an UPDATE then locks every row),
    where the equalities are one primary-key lookup."""
    if len(rows) == 1:
        return sa.and_(*(column == value for column, value in zip(columns, rows[0], strict=True)))
    return sa.tuple_(*columns).in_(list(rows))


def per_row(id_column: sa.ColumnElement[Any], by_id: Mapping[int, Any]) -> Any:
    """One bound value when every row gets the same, else `CASE id WHEN :id THEN :v ... END`
    (per-row values in one statement: broker ids, reasons)."""
    distinct = set(by_id.values())
    if len(distinct) == 1:
        return next(iter(distinct))
    return sa.case(dict(by_id), value=id_column)


def cas_each(
    conn: Connection,
    table: sa.Table,
    move: Transition | str,
    rows: Sequence[tuple[int, int, Any]],
    *,
    column: str,
    now: dt.datetime,
    by: str,
    values: Mapping[str, Any] | None = None,
) -> int:
    """`cas` for many rows at their own `(id, lock_version)`, each setting its own value of
    `column` (a sender marking a batch SENT with each row's broker id); `values` are constants
    for every row. Return how many rows changed.

    The rows travel as one JSON parameter the database unpacks itself (PostgreSQL
    `jsonb_array_elements`, MySQL/MariaDB `JSON_TABLE`, SQLite `json_each`), so the statement's
    text is the same for every batch and nothing is built per row (arrays cost psycopg a Python
    loop per element). Other databases get one `cas` with a `CASE id WHEN ...` per chunk.
    """
    step = transition(move) if isinstance(move, str) else move
    if not rows:
        return 0
    dialect = conn.dialect.name
    if dialect not in _JOINED:
        changed = 0
        for i in range(0, len(rows), CHUNK):
            chunk = rows[i:i + CHUNK]
            changed += cas(conn, table, step, Versions([(r[0], r[1]) for r in chunk]), now=now,
                           by=by, values={**(values or {}),
                                          column: per_row(table.c.id, {r[0]: r[2] for r in chunk})})
        return changed
    consts: dict[str, Any] = {"ckit_target": int(step.target), "ckit_now": now, "ckit_by": by[:128],
              **{f"ckit_v_{k}": v for k, v in (values or {}).items()}}
    text = _joined_statement(dialect, table, step, column, tuple(sorted(values or {})))
    # one JSON text: json.dumps is one C call, where the driver dumps arrays element by element
    consts["ckit_rows"] = json.dumps([list(r) for r in rows], default=str)
    return int(conn.execute(text, consts).rowcount)


_JOINED = ("postgresql", "mysql", "mariadb", "sqlite")


@functools.lru_cache(maxsize=64)
def _joined_statement(dialect: str, table: sa.Table, step: Transition, column: str,
                      keys: tuple[str, ...]) -> sa.TextClause:
    """The statement text of `cas_each` for one table, transition and set of columns (built
    once: table and column names are validated identifiers, every value is a bound parameter).
    """
    t = table.name
    states = ", ".join(str(int(s)) for s in step.sources)
    sets = ["state = :ckit_target", f"{column} = v.val", "lock_version = o.lock_version + 1",
            "gmt_modified = :ckit_now", "updated_by = :ckit_by",
            *(f"{k} = :ckit_v_{k}" for k in keys)]
    if dialect == "postgresql":
        sql = (f"UPDATE {t} AS o SET {', '.join(sets)} "
               "FROM (SELECT CAST(r->>0 AS BIGINT) AS id, CAST(r->>1 AS INTEGER) AS lv, "
               "r->>2 AS val FROM jsonb_array_elements(CAST(:ckit_rows AS JSONB)) AS e(r)) AS v "
               f"WHERE o.id = v.id AND o.lock_version = v.lv AND o.state IN ({states})")
    elif dialect == "sqlite":
        sets = [s.replace("o.lock_version", "lock_version") for s in sets]
        sql = (f"UPDATE {t} SET {', '.join(sets)} FROM (SELECT json_extract(value, '$[0]') AS id, "
               "json_extract(value, '$[1]') AS lv, json_extract(value, '$[2]') AS val "
               "FROM json_each(:ckit_rows)) AS v "
               f"WHERE {t}.id = v.id AND {t}.lock_version = v.lv AND {t}.state IN ({states})")
    else:
        # The batch's rows first, the outbox by primary key: left to itself, MariaDB scans a
        # small outbox instead, and a multi-table UPDATE waits on every row it scans (no
        # semi-consistent read), so two relays marking their batches deadlocked (and a batch
        # was sent again)
        sets = [f"o.{s}" for s in sets]
        sql = ("UPDATE JSON_TABLE(:ckit_rows, '$[*]' COLUMNS (id BIGINT PATH '$[0]', "
               "lv INT PATH '$[1]', val VARCHAR(2000) PATH '$[2]')) AS v "
               f"STRAIGHT_JOIN {t} AS o ON o.id = v.id AND o.lock_version = v.lv "
               f"SET {', '.join(sets)} WHERE o.state IN ({states})")
    return sa.text(sql).execution_options(**{OPTION: step.name})
