"""Operator actions on the outbox: stats, show, retry, suspend, resume, archive.

Every state change is a guarded compare-and-set, one row at a time::

    UPDATE outbox SET state=:to, lock_version=lock_version+1, gmt_modified=:now,
                      updated_by='operator', ...
     WHERE id=:id AND state IN (:allowed) AND lock_version=:seen

and the row count is checked: a row that a relay, the ack applier or the reconciler moved between
our read and our write is reported as a conflict, never overwritten.

Decisions (documented for operators in `ckit outbox --help` and schema/README.md):

* `retry` re-queues FAILED, SUSPENDED and REJECTED rows (plus SENT and CONSUMED with `force`):
  state PENDING, `retry_count` 0, `next_retry_at` now, lease cleared. `fail_reason` is kept,
  prefixed with `operator retry (was STATE): ` so the last error stays visible until the next send
  attempt overwrites it (the prefix is not stacked on repeated retries). The message's ack rows
  are deleted in the same transaction: the re-send starts its delivery over, and the acks it
  gets decide (an old REJECTED ack would otherwise shadow the group's new answer). A group that
  already consumed the message dedupes the re-send without acking again; with expected groups
  such a row waits in SENT for the reconciler, which finds the processed row and marks it.
* `suspend` holds PENDING, FAILED and SENDING-with-an-expired-lease rows; a live lease is refused.
* `resume` puts SUSPENDED rows back to PENDING, due now, keeping `retry_count`.
* `archive` moves CONSUMED and REJECTED rows whose `gmt_modified` is older than the horizon (the
  last change: for CONSUMED rows the ack, for REJECTED rows the rejection). REJECTED rows are
  archived too: they keep their reason in the archive table, and an operator who wants one re-sent
  has the whole horizon (30 days by default) to `retry` it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.clock import utcnow
from consumer_kit.db import check_tables
from consumer_kit.schema import REASON_LEN, OutboxState, TableNames, ack_table, outbox_table

OPERATOR = "operator"
RETRY_PREFIX = "operator retry"
RETRY_FROM: tuple[OutboxState, ...] = (
    OutboxState.FAILED,
    OutboxState.SUSPENDED,
    OutboxState.REJECTED,
)
FORCE_ONLY: tuple[OutboxState, ...] = (OutboxState.SENT, OutboxState.CONSUMED)
FORCE_RETRY_FROM: tuple[OutboxState, ...] = (*RETRY_FROM, *FORCE_ONLY)
SUSPEND_FROM: tuple[OutboxState, ...] = (
    OutboxState.PENDING,
    OutboxState.FAILED,
    OutboxState.SENDING,
)
RESUME_FROM: tuple[OutboxState, ...] = (OutboxState.SUSPENDED,)
ARCHIVE_STATES: tuple[OutboxState, ...] = (OutboxState.CONSUMED, OutboxState.REJECTED)

DEFAULT_LAG_WINDOW = dt.timedelta(hours=1)
DEFAULT_LAG_SAMPLE = 10_000
DEFAULT_BULK_LIMIT = 1000
DEFAULT_ARCHIVE_BATCH = 1000
DEFAULT_ARCHIVE_MAX_BATCHES = 1000


@dataclasses.dataclass(frozen=True)
class OutboxTables:
    """The tables the operator commands work on (outbox, its ack rows, its archive)."""

    outbox: sa.Table
    ack: sa.Table
    archive: sa.Table

    @classmethod
    def from_names(cls, names: TableNames | None = None) -> OutboxTables:
        """Build the tables for validated names (`ConfigError` is raised by `TableNames`)."""
        from consumer_kit.ddl import apply_table_options
        from consumer_kit.schema import outbox_archive_table

        names = names or TableNames()
        metadata = sa.MetaData()
        tables = cls(
            outbox=outbox_table(metadata, names.outbox),
            ack=ack_table(metadata, names.outbox_ack),
            archive=outbox_archive_table(metadata, names.outbox_archive),
        )
        apply_table_options(metadata)
        return tables


# --------------------------------------------------------------------------------------- stats


@dataclasses.dataclass(frozen=True)
class LagStats:
    """Sent-to-consumed lag in seconds over a sample of recently sent, now consumed rows."""

    samples: int
    p50: float
    p95: float
    max: float


@dataclasses.dataclass(frozen=True)
class OutboxStats:
    """What `ckit outbox stats` prints."""

    counts: dict[str, int]
    total: int
    oldest_pending_age_s: float | None
    oldest_sent_age_s: float | None
    lag: LagStats | None
    lag_window_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence (`fraction` in 0..1)."""
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


def stats(
    engine: Engine,
    table: sa.Table,
    *,
    lag_window: dt.timedelta = DEFAULT_LAG_WINDOW,
    lag_sample: int = DEFAULT_LAG_SAMPLE,
    now: dt.datetime | None = None,
) -> OutboxStats:
    """Counts per state (every state, 0 when absent), oldest PENDING/SENT ages and the lag.

    Ages are measured from `gmt_create` (PENDING) and `sent_at` (SENT). The lag is computed in
    Python over at most `lag_sample` CONSUMED rows sent within `lag_window` (served by the
    `(state, sent_at)` index); rows whose ack beat the SENT mark count as 0 s.

    Raises:
        SchemaError: the table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    check_tables(engine, table)
    now = now or utcnow()
    c = table.c
    with engine.connect() as conn:
        counts = {s.name: 0 for s in OutboxState}
        for state, count in conn.execute(sa.select(c.state, sa.func.count()).group_by(c.state)):
            try:
                counts[OutboxState(state).name] = int(count)
            except ValueError:  # a code this version does not know: still count it
                counts[f"UNKNOWN_{state}"] = int(count)
        oldest_pending = conn.scalar(
            sa.select(sa.func.min(c.gmt_create)).where(c.state == OutboxState.PENDING)
        )
        oldest_sent = conn.scalar(
            sa.select(sa.func.min(c.sent_at)).where(c.state == OutboxState.SENT)
        )
        rows = conn.execute(
            sa.select(c.sent_at, c.consumed_at)
            .where(c.state == OutboxState.CONSUMED, c.sent_at >= now - lag_window)
            .order_by(c.sent_at.desc())
            .limit(lag_sample)
        ).all()
    lags = sorted(
        max(0.0, (consumed - sent).total_seconds()) for sent, consumed in rows if consumed and sent
    )
    lag = (
        LagStats(len(lags), percentile(lags, 0.5), percentile(lags, 0.95), lags[-1])
        if lags
        else None
    )
    return OutboxStats(
        counts=counts,
        total=sum(counts.values()),
        oldest_pending_age_s=_age(now, oldest_pending),
        oldest_sent_age_s=_age(now, oldest_sent),
        lag=lag,
        lag_window_s=lag_window.total_seconds(),
    )


def _age(now: dt.datetime, then: dt.datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


# ---------------------------------------------------------------------------------------- show


@dataclasses.dataclass(frozen=True)
class MessageView:
    """One outbox row with its ack rows (what `ckit outbox show` prints)."""

    row: dict[str, Any]
    acks: list[dict[str, Any]]

    @property
    def state(self) -> OutboxState:
        """The row's state as the enum."""
        return OutboxState(self.row["state"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: state by name, body as text (or base64 when it is not UTF-8)."""
        import base64

        row = dict(self.row)
        row["state"] = self.state.name
        body = row.get("body")
        if isinstance(body, (bytes, bytearray, memoryview)):
            raw = bytes(body)
            try:
                row["body"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                row["body"] = base64.b64encode(raw).decode("ascii")
                row["body_encoding"] = "base64"
        return {"message": row, "acks": self.acks}


def show(engine: Engine, tables: OutboxTables, ident: str) -> list[MessageView]:
    """Return the row whose `message_id` is `ident`, else every row whose `biz_key` is `ident`.

    A biz key may be shared by several biz types, so a list comes back (empty: nothing matched).
    Each view carries the message's ack rows, sorted by consumer group.

    Raises:
        SchemaError: a table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    check_tables(engine, tables.outbox, tables.ack)
    c = tables.outbox.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(tables.outbox).where(c.message_id == ident)).mappings().all()
        if not rows:
            # The unique (biz_type, biz_key) index leads with biz_type: list the (few) biz types
            # first (a loose index scan) so the lookup is an index range, not a table scan.
            types = list(conn.scalars(sa.select(c.biz_type).group_by(c.biz_type)))
            query = (
                sa.select(tables.outbox)
                .where(c.biz_type.in_(types), c.biz_key == ident)
                .order_by(c.biz_type, c.id)
            )
            rows = conn.execute(query).mappings().all() if types else []
        views = []
        for row in rows:
            acks = conn.execute(
                sa.select(tables.ack)
                .where(tables.ack.c.message_id == row["message_id"])
                .order_by(tables.ack.c.consumer_group)
            ).mappings()
            views.append(MessageView(dict(row), [dict(a) for a in acks]))
    return views


# --------------------------------------------------------------------------------- transitions


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


def _load(conn: Connection, table: sa.Table, targets: Sequence[int | str]) -> dict[int | str, Any]:
    """Map each target (row id as int, message_id as str) to its row (id, state, version, lease)."""
    c = table.c
    ids = [t for t in targets if isinstance(t, int)]
    message_ids = [t for t in targets if isinstance(t, str)]
    cols = (c.id, c.message_id, c.state, c.lock_version, c.lease_until, c.lease_owner,
            c.fail_reason)  # fmt: skip
    found: dict[int | str, Any] = {}
    for chunk in _chunks(ids, 500):
        for row in conn.execute(sa.select(*cols).where(c.id.in_(chunk))):
            found[row.id] = row
    for chunk_m in _chunks(message_ids, 500):
        for row in conn.execute(sa.select(*cols).where(c.message_id.in_(chunk_m))):
            found[row.message_id] = row
    return found


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


#: Why a row may not change (None: it may): `(row, state, now) -> reason`.
Refuse = Callable[[Any, OutboxState, dt.datetime], str | None]
#: The extra columns to set: `(row, state, now) -> values`.
Values = Callable[[Any, OutboxState, dt.datetime], dict[str, Any]]
#: Run after a row changed, in the same transaction: `(conn, row) -> None`.
After = Callable[[Connection, Any], None]


def _transition(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str],
    *,
    action: str,
    to: OutboxState,
    allowed: Sequence[OutboxState],
    values: Values,
    refuse: Refuse | None = None,
    after: After | None = None,
    also_needs: Sequence[sa.Table] = (),
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Read every target, then compare-and-set each one that is in an allowed state; `after`
    runs for each changed row in the same transaction (on `also_needs` tables)."""
    check_tables(engine, table, *also_needs)
    now = now or utcnow()
    wanted = list(dict.fromkeys(targets))
    result = TransitionResult(action)
    with engine.connect() as conn:
        rows = _load(conn, table, wanted)
    c = table.c
    allowed_codes = [int(s) for s in allowed]
    with engine.begin() as conn:
        for target in wanted:
            row = rows.get(target)
            if row is None:
                result.refused.append(Refusal(target, None, "not found"))
                continue
            state = OutboxState(row.state)
            why = refuse(row, state, now) if refuse else None
            if why is None and state not in allowed:
                why = f"{action} needs {'/'.join(s.name for s in allowed)}, row is {state.name}"
            if why is not None:
                result.refused.append(Refusal(target, state.name, why))
                continue
            update = (
                sa.update(table)
                .where(
                    c.id == row.id,
                    c.state.in_(allowed_codes),
                    c.lock_version == row.lock_version,
                )
                .values(
                    state=int(to),
                    lock_version=c.lock_version + 1,
                    gmt_modified=now,
                    updated_by=OPERATOR,
                    **values(row, state, now),
                )
            )
            if conn.execute(update).rowcount == 1:
                if after is not None:
                    after(conn, row)
                result.changed.append(int(row.id))
            else:
                result.refused.append(
                    Refusal(target, state.name, "conflict: the row changed meanwhile; try again")
                )
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
    """The states `retry` accepts: `states` (default: all it may retry), checked against
    FORCE_RETRY_FROM with `force`, else RETRY_FROM.

    Raises:
        ValueError: a state cannot be retried (PENDING, SENDING), or needs `force` (SENT,
            CONSUMED); the message names the valid ones.
    """
    valid = FORCE_RETRY_FROM if force else RETRY_FROM
    if states is None:
        return valid
    bad = ", ".join(s.name for s in states if s not in valid)
    if bad:
        hint = "" if force else f"; {', '.join(s.name for s in FORCE_ONLY)} with --force"
        raise ValueError(f"cannot retry {bad} rows (valid: "
                         f"{', '.join(s.name for s in valid)}{hint})")
    return tuple(dict.fromkeys(states))


def retry(
    engine: Engine,
    tables: OutboxTables,
    targets: Iterable[int | str],
    *,
    states: Sequence[OutboxState] | None = None,
    force: bool = False,
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Put rows back to PENDING, due now, with `retry_count` 0, and delete their ack rows in the
    same transaction (see the module doc for the fields).

    `targets` are row ids (int) or message ids (str). Rows must be in `states`: by default
    FAILED, SUSPENDED and REJECTED, plus SENT and CONSUMED with `force=True`; SENT and CONSUMED
    need `force` whatever `states` says.

    Raises:
        ValueError: `states` names a state that cannot be retried (PENDING, SENDING), or SENT or
            CONSUMED without `force`.
        SchemaError: a table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.

    >>> retry(engine, tables, ["01HV..."])  # doctest: +SKIP
    """
    allowed = retry_states(states, force=force)
    acks = tables.ack

    def refuse(_row: Any, state: OutboxState, _now: dt.datetime) -> str | None:
        if state in FORCE_ONLY and not force:
            return f"{state.name} rows are re-sent only with --force"
        return None

    def drop_acks(conn: Connection, row: Any) -> None:
        conn.execute(sa.delete(acks).where(acks.c.message_id == row.message_id))

    return _transition(
        engine, tables.outbox, targets, action="retry", to=OutboxState.PENDING, allowed=allowed,
        refuse=refuse, after=drop_acks, also_needs=[acks], now=now,
        values=lambda row, state, now: {
            "retry_count": 0, "next_retry_at": now, "lease_owner": None, "lease_until": None,
            "fail_reason": _retry_reason(row.fail_reason, state),
        },
    )  # fmt: skip


def suspend(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str],
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

    return _transition(
        engine, table, targets, action="suspend", to=OutboxState.SUSPENDED, allowed=SUSPEND_FROM,
        refuse=refuse, now=now,
        values=lambda row, state, now: {"lease_owner": None, "lease_until": None},
    )  # fmt: skip


def resume(
    engine: Engine,
    table: sa.Table,
    targets: Iterable[int | str],
    *,
    now: dt.datetime | None = None,
) -> TransitionResult:
    """Put SUSPENDED rows back to PENDING, due now (`retry_count` kept).

    Raises:
        SchemaError: the table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    return _transition(
        engine, table, targets, action="resume", to=OutboxState.PENDING, allowed=RESUME_FROM,
        now=now, values=lambda row, state, now: {"next_retry_at": now},
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
        ValueError: `limit` is not positive.
        SchemaError: the table is missing.
    """
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}")
    check_tables(engine, table)
    c = table.c
    query = sa.select(c.id).where(c.state.in_([int(s) for s in states]))
    if topic is not None:
        query = query.where(c.topic == topic)
    with engine.connect() as conn:
        return [int(i) for i in conn.scalars(query.order_by(c.id).limit(limit))]


# ------------------------------------------------------------------------------------- archive
