"""Membership, queue leases and offsets of one consumer group of the SQL transport.

Every state change is a guarded UPDATE whose row count is checked: a lease is taken with a CAS on
`lock_version` when it is free, expired or already ours; renewed and released only by its owner;
offsets only move forward. Clocks: lease times are the members' UTC clocks, so hosts sharing a
MariaDB need clocks within a small part of `lease_seconds` (NTP); each member measures its
clock against the database's when it joins and every `CLOCK_CHECK_EVERY` seconds after, and
warns beyond a quarter of the lease (`core.db_clock`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db_clock import ClockWatch
from consumer_kit.core.errors import DuplicateKey
from consumer_kit.core.schema import MqTables
from consumer_kit.transports.sql.database import Database

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]

#: seconds between two measurements of a member's clock against the database's
CLOCK_CHECK_EVERY = 60.0
#: seconds before a member warns again of a topic another member holds and it does not subscribe
FOREIGN_TOPIC_WARN_EVERY = 600.0


def new_member_id() -> str:
    """`host:pid:random`, unique per consumer, readable in the member and lease tables."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def allocate(queues: Sequence[QueueKey], members: Sequence[str], me: str) -> set[QueueKey]:
    """RocketMQ's circular allocation: queue k (in sorted order) goes to member k mod n.

    >>> sorted(allocate([("t", 0), ("t", 1), ("t", 2)], ["a", "b"], "b"))
    [('t', 1)]
    """
    ordered_members = sorted(set(members) | {me})
    index = ordered_members.index(me)
    return {q for k, q in enumerate(sorted(queues)) if k % len(ordered_members) == index}


@dataclasses.dataclass(frozen=True)
class Lease:
    """A lease this member holds (the `lock_version` its next change must match)."""

    key: QueueKey
    lock_version: int


class GroupStore:
    """The SQL of one member of one group."""

    def __init__(self, db: Database, tables: MqTables, group: str, member_id: str,
                 lease_seconds: float) -> None:
        self.db = db
        self.t = tables
        self.group = group
        self.member_id = member_id
        self.lease = dt.timedelta(seconds=lease_seconds)
        self.clock = ClockWatch(db.engine, self.lease, f"SQL transport consumer of {group}")
        self._clock_due = 0.0
        self._foreign_warned: dict[str, float] = {}  # topic -> monotonic time to warn again

    # -- membership ------------------------------------------------------------------------------

    def heartbeat(self) -> list[str]:
        """Mark this member alive for one lease; return the live members of the group."""
        if time.monotonic() >= self._clock_due:
            self._clock_due = time.monotonic() + CLOCK_CHECK_EVERY
            self.clock.check()
        mem = self.t.member
        now = utcnow()
        mine = (mem.c.consumer_group == self.group) & (mem.c.member_id == self.member_id)

        def beat(conn: sa.Connection) -> None:
            if conn.execute(sa.update(mem).where(mine)
                            .values(alive_until=now + self.lease)).rowcount == 1:
                return
            conn.execute(sa.insert(mem), [{"consumer_group": self.group,
                                           "member_id": self.member_id,
                                           "alive_until": now + self.lease, "started_at": now}])
            # long-dead members of the group go too (guarded by their expiry)
            conn.execute(sa.delete(mem).where(mem.c.consumer_group == self.group,
                                              mem.c.alive_until < now - 10 * self.lease))

        self.db.run(beat, write=True, what="heartbeat")
        return list(self.db.run(lambda conn: conn.execute(
            sa.select(mem.c.member_id).where(mem.c.consumer_group == self.group,
                                             mem.c.alive_until > now)).scalars().all(),
            write=False, what="list members"))

    def check_subscriptions(self, topics: Iterable[str]) -> None:
        """Warn when a live member of the group holds a queue of a topic outside `topics` (this
        member's): the allocation shares every queue among all members, so the queues this
        member is given of that topic, and the other member of ours, are consumed by no one.
        Once per topic every `FOREIGN_TOPIC_WARN_EVERY` seconds."""
        le = self.t.lease
        now = utcnow()
        held = self.db.run(lambda conn: conn.execute(
            sa.select(le.c.topic, sa.func.min(le.c.owner)).where(
                le.c.consumer_group == self.group, le.c.owner.is_not(None),
                le.c.owner != self.member_id, le.c.lease_until > now,
                le.c.topic.not_in(sorted(set(topics)))).group_by(le.c.topic)).all(),
            write=False, what="read the group's leases")
        for topic, owner in held:
            if time.monotonic() < self._foreign_warned.get(topic, 0.0):
                continue
            self._foreign_warned[topic] = time.monotonic() + FOREIGN_TOPIC_WARN_EVERY
            log.warning("consumer %s of group %s: member %s holds queues of topic %s, which this "
                        "member does not subscribe: every member of a group must subscribe the "
                        "same topics, or some queues of each are consumed by no one (a group "
                        "name used by two apps, or a deploy still rolling out a listener)",
                        self.member_id, self.group, owner, topic)

    def leave(self) -> None:
        """Remove this member, so the others take its queues at their next rebalance."""
        mem = self.t.member
        self.db.run(lambda conn: conn.execute(sa.delete(mem).where(
            mem.c.consumer_group == self.group, mem.c.member_id == self.member_id)),
            write=True, what="leave the group")

    def queues(self, topics: Iterable[str]) -> dict[QueueKey, int]:
        """Every queue of `topics` with its next offset (the head)."""
        q = self.t.queue
        rows = self.db.run(lambda conn: conn.execute(
            sa.select(q.c.topic, q.c.queue_id, q.c.next_offset)
            .where(q.c.topic.in_(sorted(set(topics))))).all(), write=False, what="read queues")
        return {(topic, int(qid)): int(head) for topic, qid, head in rows}

    # -- leases ----------------------------------------------------------------------------------

    def _lease_where(self, key: QueueKey) -> sa.ColumnElement[bool]:
        le = self.t.lease
        return ((le.c.consumer_group == self.group) & (le.c.topic == key[0])
                & (le.c.queue_id == key[1]))

    def acquire(self, key: QueueKey) -> tuple[Lease, int] | None:
        """Take the lease of `key` if it is free, expired or ours; return it and the committed
        offset to resume from, or None when another live member holds it."""
        le = self.t.lease
        now = utcnow()
        holder = self.db.run(lambda conn: conn.execute(
            sa.select(le.c.owner, le.c.lease_until).where(self._lease_where(key))).first(),
            write=False, what="read a queue lease")
        if holder is not None and holder.owner not in (None, self.member_id) \
                and holder.lease_until is not None and holder.lease_until > now:
            return None  # held by a live member: no write transaction needed to learn that

        def take(conn: sa.Connection) -> tuple[Lease, int] | None:
            row = conn.execute(sa.select(le.c.owner, le.c.lease_until, le.c.lock_version)
                               .where(self._lease_where(key))).first()
            if row is None:
                conn.execute(sa.insert(le), [{
                    "consumer_group": self.group, "topic": key[0], "queue_id": key[1],
                    "owner": self.member_id, "lease_until": now + self.lease, "lock_version": 0,
                    "updated_at": now}])
                version = 0
            else:
                owner, until, version = row
                if owner not in (None, self.member_id) and until is not None and until > now:
                    return None
                taken = conn.execute(sa.update(le).where(
                    self._lease_where(key), le.c.lock_version == version).values(
                    owner=self.member_id, lease_until=now + self.lease,
                    lock_version=version + 1, updated_at=now))
                if taken.rowcount != 1:
                    return None  # someone else won the CAS
                version += 1
            return Lease(key, version), self._committed_offset(conn, key, now)

        try:
            return self.db.run(take, write=True, what="take a queue lease")
        except DuplicateKey:  # a concurrent first insert: the other member won
            return None

    def _committed_offset(self, conn: sa.Connection, key: QueueKey, now: dt.datetime) -> int:
        off = self.t.offset
        where = ((off.c.consumer_group == self.group) & (off.c.topic == key[0])
                 & (off.c.queue_id == key[1]))
        committed = conn.execute(sa.select(off.c.committed_offset).where(where)
                                 ).scalar_one_or_none()
        if committed is None:
            conn.execute(sa.insert(off), [{"consumer_group": self.group, "topic": key[0],
                                           "queue_id": key[1], "committed_offset": 0,
                                           "updated_at": now}])
            return 0
        return int(committed)

    def renew(self, leases: Iterable[Lease]) -> dict[QueueKey, Lease]:
        """Extend our leases; return the renewed ones (a missing key means the lease was lost)."""
        le = self.t.lease
        now = utcnow()

        def renew_all(conn: sa.Connection) -> dict[QueueKey, Lease]:
            kept: dict[QueueKey, Lease] = {}
            for lease in leases:
                done = conn.execute(sa.update(le).where(
                    self._lease_where(lease.key), le.c.owner == self.member_id,
                    le.c.lock_version == lease.lock_version).values(
                    lease_until=now + self.lease, lock_version=lease.lock_version + 1,
                    updated_at=now))
                if done.rowcount == 1:
                    kept[lease.key] = Lease(lease.key, lease.lock_version + 1)
            return kept

        return self.db.run(renew_all, write=True, what="renew queue leases")

    def release(self, lease: Lease, offset: int | None) -> bool:
        """Commit `offset` (when given) and give the lease up; False if it was not ours any more."""
        le = self.t.lease
        now = utcnow()

        def give_up(conn: sa.Connection) -> bool:
            if offset is not None:
                self._commit(conn, lease.key, offset, now)
            return conn.execute(sa.update(le).where(
                self._lease_where(lease.key), le.c.owner == self.member_id,
                le.c.lock_version == lease.lock_version).values(
                owner=None, lease_until=None, lock_version=lease.lock_version + 1,
                updated_at=now)).rowcount == 1

        return self.db.run(give_up, write=True, what="release a queue lease")

    # -- offsets ---------------------------------------------------------------------------------

    def commit(self, offsets: dict[QueueKey, int]) -> None:
        """Move committed offsets forward (never back) in one transaction."""
        now = utcnow()

        def commit_all(conn: sa.Connection) -> None:
            for key, offset in offsets.items():
                self._commit(conn, key, offset, now)

        self.db.run(commit_all, write=True, what="commit offsets")

    def _commit(self, conn: sa.Connection, key: QueueKey, offset: int, now: dt.datetime) -> None:
        off = self.t.offset
        moved = conn.execute(sa.update(off).where(
            off.c.consumer_group == self.group, off.c.topic == key[0], off.c.queue_id == key[1],
            off.c.committed_offset < offset).values(committed_offset=offset, updated_at=now))
        if moved.rowcount != 1:  # another owner already committed further (after a takeover)
            log.debug("offset of %s %s/%d already at or past %d", self.group, key[0], key[1],
                      offset)

    def committed_offsets(self, topics: Iterable[str]) -> dict[QueueKey, int]:
        """Committed offsets of the group on `topics`."""
        off = self.t.offset
        rows = self.db.run(lambda conn: conn.execute(
            sa.select(off.c.topic, off.c.queue_id, off.c.committed_offset).where(
                off.c.consumer_group == self.group, off.c.topic.in_(sorted(set(topics))))).all(),
            write=False, what="read offsets")
        return {(topic, int(qid)): int(value) for topic, qid, value in rows}

    def count_due(self, topics: Iterable[str], *, waiting: str | None = None) -> int:
        """Scheduled messages of `topics` whose effect time has come (not yet in a queue), plus
        every scheduled message of topic `waiting` whatever its time (a group's redeliveries)."""
        m = self.t.message
        now = utcnow()
        due = sa.and_(m.c.topic.in_(sorted(set(topics))), m.c.deliver_at <= now)
        if waiting is not None:
            due = sa.or_(due, m.c.topic == waiting)
        return int(self.db.run(lambda conn: conn.execute(
            sa.select(sa.func.count()).select_from(m).where(
                m.c.queue_offset.is_(None), due)).scalar_one(),
            write=False, what="count due messages"))

    def fetch(self, key: QueueKey, start: int, limit: int) -> Sequence[sa.Row[tuple[object, ...]]]:
        """Messages of queue `key` from offset `start`, in offset order."""
        m = self.t.message
        return self.db.run(lambda conn: conn.execute(
            sa.select(m).where(m.c.topic == key[0], m.c.queue_id == key[1],
                               m.c.queue_offset >= start)
            .order_by(m.c.queue_offset).limit(limit)).all(), write=False, what="fetch messages")
