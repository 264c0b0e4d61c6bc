"""Claiming due outbox rows under a lease: SKIP LOCKED where the database has it, else an
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
from sqlalchemy.engine import Engine

from consumer_kit.clock import utcnow
from consumer_kit.db import supports_skip_locked
from consumer_kit.schema import OutboxState

_CLAIM_SEQ = itertools.count(1)

#: How long a claim holds a row in SENDING; an expired lease is reclaimed by any relay.
DEFAULT_LEASE = dt.timedelta(seconds=30)

#: Columns a sender needs; the body is the big one, and it is read once, at claim time.
SEND_COLUMNS = ("id", "message_id", "biz_type", "biz_key", "topic", "tags", "keys", "headers",
                "body", "retry_count", "max_retries", "created_by", "gmt_create", "lock_version")


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
        """Parse `i/N`, e.g. `0/4`; raise `ValueError` with the expected form."""
        try:
            index, total = (int(p) for p in text.split("/"))
        except ValueError:
            raise ValueError(f"invalid shard {text!r}: use i/N, e.g. 0/4") from None
        if total < 1 or not 0 <= index < total:
            raise ValueError(f"invalid shard {text!r}: need 0 <= i < N")
        return cls(index, total)


@dataclasses.dataclass
class Claimer:
    """Claims due rows of one outbox table and sets them SENDING with a lease."""

    engine: Engine
    table: sa.Table
    owner: str
    lease: dt.timedelta = DEFAULT_LEASE
    shard: Shard | None = None
    retry_failed: bool = False

    def __post_init__(self) -> None:
        self.skip_locked = supports_skip_locked(self.engine)

    def _due_states(self) -> list[int]:
        states = [int(OutboxState.PENDING)]
        if self.retry_failed:
            states.append(int(OutboxState.FAILED))
        return states

    def _where(self, now: dt.datetime) -> list[Any]:
        t = self.table
        clauses: list[Any] = [t.c.state.in_(self._due_states()), t.c.next_retry_at <= now]
        if self.shard is not None:
            clauses.append(t.c.id % self.shard.total == self.shard.index)
        return clauses

    def _expired_where(self, now: dt.datetime) -> list[Any]:
        t = self.table
        clauses: list[Any] = [t.c.state == int(OutboxState.SENDING), t.c.lease_until < now]
        if self.shard is not None:
            clauses.append(t.c.id % self.shard.total == self.shard.index)
        return clauses

    def claim(self, batch: int) -> list[dict[str, Any]]:
        """Claim up to `batch` due rows (and SENDING rows whose lease expired); return them."""
        now = utcnow()
        if self.skip_locked:
            return self._claim_locked(batch, now)
        return self._claim_optimistic(batch, now)

    def _claim_values(self, now: dt.datetime, token: str) -> dict[str, Any]:
        t = self.table
        return {
            "state": int(OutboxState.SENDING), "lease_owner": token,
            "lease_until": now + self.lease, "lock_version": t.c.lock_version + 1,
            "last_attempt_at": now, "gmt_modified": now, "updated_by": self.owner[:128],
        }

    def _claim_locked(self, batch: int, now: dt.datetime) -> list[dict[str, Any]]:
        t = self.table
        cols = [t.c[name] for name in SEND_COLUMNS]
        with self.engine.begin() as conn:
            rows = conn.execute(
                sa.select(*cols).where(*self._where(now)).order_by(t.c.next_retry_at)
                .limit(batch).with_for_update(skip_locked=True)
            ).mappings().all()
            if len(rows) < batch:
                rows = [*rows, *conn.execute(
                    sa.select(*cols).where(*self._expired_where(now))
                    .limit(batch - len(rows)).with_for_update(skip_locked=True)
                ).mappings().all()]
            if not rows:
                return []
            ids = [r["id"] for r in rows]
            conn.execute(sa.update(t).where(t.c.id.in_(ids))
                         .values(**self._claim_values(now, self.owner)))
        return [{**r, "lock_version": r["lock_version"] + 1} for r in rows]

    def _claim_optimistic(self, batch: int, now: dt.datetime) -> list[dict[str, Any]]:
        t = self.table
        token = f"{self.owner[:100]}#{next(_CLAIM_SEQ)}"
        with self.engine.begin() as conn:
            ids = list(conn.execute(
                sa.select(t.c.id).where(*self._where(now)).order_by(t.c.next_retry_at).limit(batch)
            ).scalars())
            if len(ids) < batch:
                ids += conn.execute(
                    sa.select(t.c.id).where(*self._expired_where(now)).limit(batch - len(ids))
                ).scalars().all()
            if not ids:
                return []
            # the WHERE repeats the due condition: a row claimed by someone else meanwhile is
            # no longer due, so it is not taken twice
            due = sa.or_(sa.and_(*self._where(now)), sa.and_(*self._expired_where(now)))
            conn.execute(sa.update(t).where(t.c.id.in_(ids), due)
                         .values(**self._claim_values(now, token)))
            rows = conn.execute(
                sa.select(*[t.c[n] for n in SEND_COLUMNS])
                .where(t.c.lease_owner == token, t.c.state == int(OutboxState.SENDING))
            ).mappings().all()
        return [dict(r) for r in rows]

    def claim_ids(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Claim freshly committed PENDING rows (the dispatcher's path): compare-and-set on
        state and each row's `(id, lock_version)`; rows the relay took first are skipped.
        Returns the rows claimed, with their new `lock_version`."""
        if not rows:
            return []
        t = self.table
        now = utcnow()
        token = f"{self.owner[:100]}#{next(_CLAIM_SEQ)}"
        with self.engine.begin() as conn:
            claimed = conn.execute(
                sa.update(t).where(
                    sa.tuple_(t.c.id, t.c.lock_version).in_(
                        [(r["id"], r["lock_version"]) for r in rows]),
                    t.c.state == int(OutboxState.PENDING))
                .values(**self._claim_values(now, token))
            ).rowcount
            if claimed == len(rows):
                mine = {r["id"] for r in rows}
            else:
                mine = set(conn.execute(
                    sa.select(t.c.id).where(t.c.id.in_([r["id"] for r in rows]),
                                            t.c.lease_owner == token)
                ).scalars())
        return [{**r, "lock_version": r["lock_version"] + 1} for r in rows if r["id"] in mine]
