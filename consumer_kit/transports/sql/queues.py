"""The message log of the SQL transport: appending to a queue at its next offset, and giving
scheduled messages their offset when due, both under the queue row's lock.

An offset becomes visible only after every lower one: the queue row (`next_offset`) is locked
(`SELECT ... FOR UPDATE`, `BEGIN IMMEDIATE` on SQLite) for the append, and moved on with a
guarded UPDATE. The statements are built once: building and cache-keying Core statements per
call costs more than SQLite itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.errors import TransportError
from consumer_kit.core.schema import MqTables


class QueueLog:
    """Appends and promotions on the message and queue tables of one transport."""

    def __init__(self, tables: MqTables) -> None:
        self.tables = tables
        q = tables.queue
        this_queue = (q.c.topic == sa.bindparam("b_topic")) & (
            q.c.queue_id == sa.bindparam("b_queue"))
        self._lock_queue = sa.select(q.c.next_offset).where(this_queue).with_for_update()
        self._bump_queue = (sa.update(q).where(this_queue, q.c.next_offset == sa.bindparam("old"))
                            .values(next_offset=sa.bindparam("new")))
        self._insert_message = sa.insert(tables.message)

    def schedule(self, conn: sa.Connection, rows: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Store messages without an offset (delayed, or retries waiting for their time)."""
        conn.execute(self._insert_message, rows)

    def append(self, conn: sa.Connection, row: dict[str, Any]) -> int:
        """Insert `row` at its queue's next offset, holding the queue row's lock; return the
        offset.

        Raises:
            TransportError: the queue does not exist, or moved under its lock.
        """
        key = {"b_topic": row["topic"], "b_queue": row["queue_id"]}
        offset = conn.execute(self._lock_queue, key).scalar_one_or_none()
        if offset is None:
            raise TransportError(f"queue {row['topic']}/{row['queue_id']} does not exist")
        conn.execute(self._insert_message, {**row, "queue_offset": offset})
        if conn.execute(self._bump_queue, {**key, "old": offset, "new": offset + 1}
                        ).rowcount != 1:
            raise TransportError(f"queue {row['topic']}/{row['queue_id']} moved under its lock")
        return int(offset)

    def find_due(self, conn: sa.Connection, queues: Iterable[tuple[str, int]], now: dt.datetime,
                 limit: int) -> Sequence[sa.Row[tuple[Any, ...]]]:
        """(id, topic, queue_id) of up to `limit` scheduled messages of `queues` due by `now`,
        the earliest first. Only of `queues`, not of their whole topics: due messages of other
        members' queues (busy, or killed and still leased) held these back past `limit`."""
        m = self.tables.message
        per_topic: dict[str, list[int]] = {}
        for topic, queue_id in sorted(set(queues)):
            per_topic.setdefault(topic, []).append(queue_id)
        mine = sa.or_(*(sa.and_(m.c.topic == topic, m.c.queue_id.in_(ids))
                        for topic, ids in per_topic.items()))
        return conn.execute(
            sa.select(m.c.id, m.c.topic, m.c.queue_id)
            .where(mine, m.c.queue_offset.is_(None), m.c.deliver_at <= now)
            .order_by(m.c.deliver_at, m.c.id).limit(limit)).all()

    def promote(self, conn: sa.Connection, *, topic: str, queue_id: int, ids: list[int]) -> int:
        """Give the scheduled messages `ids` of one queue the next offsets, each with a guarded
        UPDATE (`queue_offset IS NULL`: two consumers promoting at once never give one message
        two offsets); return how many this call promoted."""
        m = self.tables.message
        key = {"b_topic": topic, "b_queue": queue_id}
        start = conn.execute(self._lock_queue, key).scalar_one_or_none()
        if start is None:
            return 0
        offset = int(start)
        for row_id in ids:
            moved = conn.execute(sa.update(m).where(m.c.id == row_id, m.c.queue_offset.is_(None))
                                 .values(queue_offset=offset))
            offset += moved.rowcount  # 0: another consumer promoted it first
        if offset != start and conn.execute(
                self._bump_queue, {**key, "old": start, "new": offset}).rowcount != 1:
            raise TransportError(f"queue {topic}/{queue_id} moved under its lock")
        return offset - int(start)
