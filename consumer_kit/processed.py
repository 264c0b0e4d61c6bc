"""The processed-messages table: the truth for deduplication (eventsourcing's tracking record).

With a session, the processed row is inserted first, inside the handler's own transaction: a
second consumer's insert of the same `(group, message_id)` waits on the row lock and then fails
with a unique clash, so exactly one business transaction commits.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from consumer_kit.core.clock import utcnow
from consumer_kit.core.schema import (
    DEFAULT_PROCESSED_TABLE,
    MESSAGE_ID_LEN,
    TAGS_LEN,
    TOPIC_LEN,
    ProcessedStatus,
    processed_table,
)
from consumer_kit.message import Message


class ProcessedStore:
    """Reads and writes one consumer group's rows of the processed table."""

    def __init__(self, engine: Engine, group: str, *, table: str = DEFAULT_PROCESSED_TABLE
                 ) -> None:
        self.engine = engine
        self.group = group
        self.table = processed_table(sa.MetaData(), table)
        # built once: executing it with a parameter dict skips per-message value coercion
        self._insert = sa.insert(self.table)

    def _row(self, msg: Message, status: ProcessedStatus, error: str | None) -> dict[str, Any]:
        now = utcnow()
        return {
            "consumer_group": self.group, "message_id": msg.id[:MESSAGE_ID_LEN],
            "topic": msg.topic[:TOPIC_LEN], "tags": (msg.tags or None) and msg.tags[:TAGS_LEN],
            "broker_message_id": msg.broker_message_id[:MESSAGE_ID_LEN] or None,
            "src": msg.producer, "status": status.value, "attempts": msg.reconsume_times + 1,
            "error": error, "first_seen_at": now, "processed_at": now,
        }

    def insert(self, conn: Connection, msg: Message, status: ProcessedStatus,
               error: str | None = None) -> bool:
        """Insert the row in `conn`'s transaction; False when it exists (a duplicate).

        On a clash the caller must roll its transaction back. The clash is confirmed on a
        connection of its own: PostgreSQL has aborted `conn`'s transaction by then.
        """
        try:
            conn.execute(self._insert, self._row(msg, status, error))
        except IntegrityError:
            if self.status(msg.id) is None:
                raise
            return False
        return True

    def record(self, msg: Message, status: ProcessedStatus, error: str | None = None) -> bool:
        """Insert the row in a transaction of its own; False when it already existed."""
        with self.engine.connect() as conn, conn.begin() as tx:
            if self.insert(conn, msg, status, error):
                return True
            tx.rollback()
        return False

    def status(self, message_id: str) -> ProcessedStatus | None:
        """The recorded (committed) status of `message_id` for this group, or None."""
        t = self.table
        query = sa.select(t.c.status).where(t.c.consumer_group == self.group,
                                            t.c.message_id == message_id[:MESSAGE_ID_LEN])
        with self.engine.connect() as conn:
            found = conn.execute(query).scalar()
        return ProcessedStatus(found) if found else None

    def purge(self, older_than: dt.timedelta, *, batch: int = 1000,
              max_batches: int | None = None) -> int:
        """Delete this group's rows processed before `now - older_than`, in bounded batches."""
        t = self.table
        horizon = utcnow() - older_than
        deleted = batches = 0
        while max_batches is None or batches < max_batches:
            with self.engine.begin() as conn:
                keys = conn.execute(
                    sa.select(t.c.message_id).where(t.c.consumer_group == self.group,
                                                    t.c.processed_at < horizon).limit(batch)
                ).scalars().all()
                if not keys:
                    break
                deleted += conn.execute(sa.delete(t).where(
                    t.c.consumer_group == self.group, t.c.message_id.in_(keys))).rowcount
            batches += 1
        return deleted
