"""Claiming due outbox rows under a send lease: SKIP LOCKED where the database has it, else an
optimistic claim with a unique token (xxl-mq's NEW -> RUNNING lock by update)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import os
import socket
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine

from consumer_kit.core import checkin
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import dialect_name, supports_skip_locked
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.rows import READ_COLUMNS, OutboxRow, headers_column
from consumer_kit.core.states import OutboxState, transition
from consumer_kit.core.transitions import Ids, Versions, Where, cas, cas_returning

_CLAIM_SEQ = itertools.count(1)

#: How long a claim holds a row in SENDING; an expired lease is reclaimed by any relay.
DEFAULT_LEASE = dt.timedelta(seconds=30)
#: The shortest send lease a relay or dispatcher takes (`check_lease`).
MIN_LEASE = dt.timedelta(seconds=1)


def check_lease(lease: dt.timedelta) -> None:
    """Refuse a send lease shorter than `MIN_LEASE`: one that runs out while its batch is
    being sent lets another relay claim the rows again and send them twice.

    Raises:
        ConfigError: `lease` is shorter (zero or negative included).
    """
    if lease < MIN_LEASE:
        raise ConfigError(
            f"a --lease of at least {MIN_LEASE.total_seconds():g}s is needed, not "
            f"{lease.total_seconds():g}s: a lease that runs out while its batch is sent lets "
            "another relay send the rows again")


#: The share of a send lease in which its holder may start sends: the rest is the margin for the
#: last send to finish and the batch to be marked before another sender may reclaim the rows.
SEND_WINDOW = 0.5


def send_deadline(claimed_at: float, lease: dt.timedelta) -> float:
    """The `time.monotonic()` value after which the holder of rows claimed at `claimed_at` (a
    `time.monotonic()` read just before the claim, so never later than the lease's start) under
    `lease` starts no more sends: `SEND_WINDOW` of the lease.

    >>> send_deadline(100.0, dt.timedelta(seconds=30))
    115.0
    """
    return claimed_at + lease.total_seconds() * SEND_WINDOW


def default_owner(kind: str) -> str:
    """A lease owner name unique to this process: `relay@host:pid`."""
    return f"{kind}@{socket.gethostname()[:60]}:{os.getpid()}"


@dataclasses.dataclass(frozen=True)
class Shard:
    """Restrict a relay to rows with `MOD(id, total) = index`."""

    index: int
    total: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse `i/N`, e.g. `0/4`; raise `ConfigError` with the expected form."""
        try:
            index, total = (int(p) for p in text.split("/"))
        except ValueError:
            raise ConfigError(f"invalid --shard {text!r}: use i/N, e.g. 0/4") from None
        if total < 1 or not 0 <= index < total:
            raise ConfigError(f"invalid --shard {text!r}: need 0 <= i < N")
        return cls(index, total)


@dataclasses.dataclass
class Claimer:
    """Claims due rows of one outbox table and sets them SENDING under a send lease."""

    engine: Engine
    table: sa.Table
    owner: str
    lease: dt.timedelta = DEFAULT_LEASE
    shard: Shard | None = None
    retry_failed: bool = False
    #: when set (a relay's `--once` run), FAILED rows due after it wait for the next run: a slow
    #: retry that fails again (even with `failed_retry_after` of 0) is tried once per run, so the
    #: run ends (PENDING retries end anyway: `max_retries` bounds them)
    failed_due_by: dt.datetime | None = None

    def __post_init__(self) -> None:
        self._skip_locked: bool | None = None
        # PostgreSQL and SQLite claim and read in one UPDATE ... RETURNING
        dialect = dialect_name(self.engine)
        self.returning = dialect in ("postgresql", "sqlite")
        self.columns = [headers_column(self.table, dialect) if name == "headers"
                        else self.table.c[name] for name in READ_COLUMNS]

    @property
    def skip_locked(self) -> bool:
        """Whether claims lock with SKIP LOCKED (asked of the database at the first claim: on
        MariaDB/MySQL it depends on the server's version)."""
        if self._skip_locked is None:
            self._skip_locked = supports_skip_locked(self.engine)
        return self._skip_locked

    @skip_locked.setter
    def skip_locked(self, value: bool) -> None:
        self._skip_locked = value

    def _sharded(self, clauses: list[Any]) -> list[Any]:
        if self.shard is not None:
            clauses.append(self.table.c.id % self.shard.total == self.shard.index)
        return clauses

    def due(self, now: dt.datetime) -> list[Any]:
        """The conditions of a row this claimer may take at `now` (PENDING and, with the slow
        retry, FAILED rows whose `next_retry_at` has come; within its shard)."""
        t = self.table
        states = [int(OutboxState.PENDING)]
        if self.retry_failed:
            states.append(int(OutboxState.FAILED))
        if self.retry_failed and self.failed_due_by is not None:
            failed_by = min(now, self.failed_due_by)
            return self._sharded([
                t.c.state.in_(states), t.c.next_retry_at <= now,
                (t.c.state == int(OutboxState.PENDING)) | (t.c.next_retry_at <= failed_by)])
        return self._sharded([t.c.state.in_(states), t.c.next_retry_at <= now])

    def expired(self, now: dt.datetime) -> list[Any]:
        """The conditions of a SENDING row whose send lease has run out (within the shard)."""
        t = self.table
        return self._sharded([t.c.state == int(OutboxState.SENDING), t.c.lease_until < now])

    def claim(self, batch: int) -> list[OutboxRow]:
        """Claim up to `batch` due rows (and SENDING rows whose lease expired); return them."""
        now = utcnow()
        if self.returning:
            return self._claim_returning(batch, now)
        if self.skip_locked:
            return self._claim_locked(batch, now)
        return self._claim_optimistic(batch, now)

    def _plan(self, now: dt.datetime) -> list[tuple[str, list[Any]]]:
        """(transition, the rows it takes) in the order a claim takes them."""
        t = self.table
        plan = [("claim", self._sharded([t.c.state == int(OutboxState.PENDING),
                                         t.c.next_retry_at <= now]))]
        if self.retry_failed:
            failed_by = now if self.failed_due_by is None else min(now, self.failed_due_by)
            plan.append(("claim_failed", self._sharded([t.c.state == int(OutboxState.FAILED),
                                                        t.c.next_retry_at <= failed_by])))
        plan.append(("reclaim", self.expired(now)))
        return plan

    def _claim_returning(self, batch: int, now: dt.datetime) -> list[OutboxRow]:
        """One `WITH picked AS MATERIALIZED (SELECT ... [FOR UPDATE SKIP LOCKED]) UPDATE ...
        FROM picked RETURNING` per claim transition (usually only the first runs): the rows come
        back already claimed. (Not `WHERE id IN (SELECT ... LIMIT ...)`: PostgreSQL may run such
        a subquery more than once and take more rows than the limit.)"""
        t = self.table
        taken: list[Any] = []
        claimed: list[tuple[int, OutboxState]] = []  # (rows, the state they came from)
        with checkin.begin(self.engine) as conn:
            for name, where in self._plan(now):
                room = batch - len(taken)
                if room <= 0:
                    break
                if taken:  # never again a row this claim just took (a lease can be that short)
                    where = [*where, t.c.id.not_in([int(r.id) for r in taken])]
                pick = sa.select(t.c.id).where(*where).order_by(t.c.next_retry_at).limit(room)
                if self.skip_locked:
                    pick = pick.with_for_update(skip_locked=True)
                picked = pick.cte("picked")
                if conn.dialect.name == "postgresql":
                    picked = picked.prefix_with("MATERIALIZED")
                # On PostgreSQL the picked rows are locked: `id = ANY(ARRAY(picked))` makes the
                # primary key the way in whatever the statistics say (a join let the planner
                # scan the backlog once per picked row on a freshly filled table: 12 s per
                # 1,000 rows). On SQLite, without row locks, the guard repeats the condition:
                # a row another claimer took meanwhile no longer matches it.
                if self.skip_locked:
                    ids = sa.select(sa.func.array_agg(picked.c.id)).scalar_subquery()
                    # (the CAST makes it an array expression, not `ANY (subquery)`)
                    guard = [t.c.id == sa.any_(sa.cast(ids, ARRAY(sa.BigInteger())))]
                else:
                    guard = [t.c.id == picked.c.id, *where]
                got = cas_returning(conn, t, name, Where(guard), returning=self.columns,
                                    now=now, by=self.owner, values=self._values(now, self.owner))
                taken += got
                # RETURNING reads the row after the UPDATE (SENDING): the transition tells
                # where it came from
                claimed.append((len(got), transition(name).sources[0]))
        rows = [OutboxRow.from_row(r) for r in taken]
        start = 0
        for count, source in claimed:
            for row in rows[start:start + count]:
                row.claimed_from = source
            start += count
        return rows

    def _values(self, now: dt.datetime, token: str) -> dict[str, Any]:
        return {"lease_owner": token, "lease_until": now + self.lease, "last_attempt_at": now}

    def _claim_all(self, conn: sa.Connection, states: dict[int, int], guard: Any,
                   now: dt.datetime, token: str) -> None:
        """One compare-and-set per claim transition: from PENDING, FAILED (slow retry) and
        SENDING (an expired lease)."""
        for state, name in _CLAIMS.items():
            if states.get(state):
                cas(conn, self.table, name, guard(state), now=now, by=self.owner,
                    values=self._values(now, token))

    def _claim_locked(self, batch: int, now: dt.datetime) -> list[OutboxRow]:
        t = self.table
        with checkin.begin(self.engine) as conn:
            rows = conn.execute(
                sa.select(*self.columns).where(*self.due(now)).order_by(t.c.next_retry_at)
                .limit(batch).with_for_update(skip_locked=True)
            ).all()
            if len(rows) < batch:
                rows = [*rows, *conn.execute(
                    sa.select(*self.columns).where(*self.expired(now))
                    .limit(batch - len(rows)).with_for_update(skip_locked=True)
                ).all()]
            if not rows:
                return []
            by_state: dict[int, list[int]] = {}
            for r in rows:
                by_state.setdefault(int(r.state), []).append(int(r.id))
            self._claim_all(conn, {s: len(ids) for s, ids in by_state.items()},
                            lambda state: Ids(by_state[state]), now, self.owner)
        return [OutboxRow.from_row(r).next_version() for r in rows]

    def _claim_optimistic(self, batch: int, now: dt.datetime) -> list[OutboxRow]:
        t = self.table
        token = f"{self.owner[:100]}#{next(_CLAIM_SEQ)}"
        with checkin.begin(self.engine) as conn:
            found = list(conn.execute(
                sa.select(t.c.id, t.c.state).where(*self.due(now))
                .order_by(t.c.next_retry_at).limit(batch)).all())
            if len(found) < batch:
                found += conn.execute(
                    sa.select(t.c.id, t.c.state)
                    .where(*self.expired(now)).limit(batch - len(found))).all()
            if not found:
                return []
            by_state: dict[int, list[int]] = {}
            for r in found:
                by_state.setdefault(int(r.state), []).append(int(r.id))
            # each guard repeats the due condition: a row claimed by someone else meanwhile
            # is no longer due, so it is not taken twice; and each transition takes only the
            # rows found in its source state, so the state read is the one claimed from
            due = {int(OutboxState.PENDING): self.due(now), int(OutboxState.FAILED):
                   self.due(now), int(OutboxState.SENDING): self.expired(now)}
            self._claim_all(conn, {s: len(ids) for s, ids in by_state.items()},
                            lambda state: Where([t.c.id.in_(by_state[state]), *due[state]]),
                            now, token)
            rows = conn.execute(
                sa.select(*self.columns)
                .where(t.c.lease_owner == token, t.c.state == int(OutboxState.SENDING))
            ).all()
        came_from = {i: state for state, ids in by_state.items() for i in ids}
        claimed = [OutboxRow.from_row(r) for r in rows]
        for row in claimed:
            row.claimed_from = OutboxState(came_from[row.id])
        return claimed

    def claim_rows(self, rows: Sequence[OutboxRow]) -> list[OutboxRow]:
        """Claim freshly committed PENDING rows (the dispatcher's path): compare-and-set on
        each row's `(id, lock_version, message_id)`; rows a relay took first are skipped.
        Returns the rows claimed, at their new `lock_version`.

        The message id is matched too: a row handed over whose transaction did not commit
        after all (a savepoint rolled back, a caller's outer transaction) is gone, and its id
        may belong to another row by now (SQLite gives a rolled-back id again; so does any
        database once the highest rows are archived). Claiming by id alone would send the
        message held here and mark that other row SENT without sending it."""
        if not rows:
            return []
        t = self.table
        now = utcnow()
        token = f"{self.owner[:100]}#{next(_CLAIM_SEQ)}"
        with checkin.begin(self.engine) as conn:
            claimed = cas(conn, t, "claim", Versions([(r.id, r.lock_version) for r in rows],
                                                     [r.message_id for r in rows]),
                          now=now, by=self.owner, values=self._values(now, token))
            if claimed == len(rows):
                return [r.next_version() for r in rows]
            # by message id too: a row of the list that never committed may share its id
            # with one claimed here
            mine = {(int(i), str(m)) for i, m in conn.execute(
                sa.select(t.c.id, t.c.message_id).where(
                    t.c.id.in_(sorted({r.id for r in rows})), t.c.lease_owner == token))}
        return [r.next_version() for r in rows if (r.id, r.message_id) in mine]


#: The claim transition for each state a claimable row can be in.
_CLAIMS = {int(OutboxState.PENDING): "claim", int(OutboxState.FAILED): "claim_failed",
           int(OutboxState.SENDING): "reclaim"}
