"""The processed-messages table: the truth for deduplication (eventsourcing's tracking record),
and the consumer's receipt outbox.

With a session, the processed row is inserted first, inside the handler's own transaction: a
second consumer's insert of the same `(group, message_id)` waits on the row lock and then fails
with a unique clash, so exactly one business transaction commits. FAILED (rejected) and
DEAD_LETTERED rows record no effect: a DEAD_LETTERED message delivered again (replayed from the
dead letters) runs again, and so does a rejected one when it is a re-send of its outbox row
(`ckit outbox retry`); a plain broker redelivery of a rejection stays a duplicate. The run
takes the row over with a guarded UPDATE in the handler's transaction.

A row whose message came from an outbox (`src` set) carries `receipt_due_at`: the receipt to
the producer is owed from then, committed with the handler's writes. `consumer_kit.receipts`
ships it and clears the column; a restarted consumer finds what is still owed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from consumer_kit.core import checkin
from consumer_kit.core.clock import utcnow
from consumer_kit.core.driver_sql import DriverSQL, execute
from consumer_kit.core.envelope import stored_text
from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.schema import (
    DEFAULT_PROCESSED_TABLE,
    MESSAGE_ID_LEN,
    NAME_LEN,
    TAGS_LEN,
    TOPIC_LEN,
    ProcessedStatus,
    processed_table,
)
from consumer_kit.message import Message

#: The shortest window `purge` may be given without `force` (`ckit processed purge`): the
#: Redis done TTL, well past the broker's redelivery horizon (RocketMQ's 16 retries span about
#: 5 h) and the relay's retries; purged earlier, a late duplicate would be applied again.
PURGE_FLOOR = dt.timedelta(days=7)


class RowClaim(enum.Enum):
    """What `ProcessedStore.claim` found for a message."""

    NEW = "new"              # no row: inserted in the caller's transaction
    RERUN = "rerun"          # a row without effect that may run again: take it with `rerun`
    DONE = "done"            # processed already: a duplicate
    DECIDED = "decided"      # rejected already, and this is no re-send: a duplicate too
    TAKEN = "taken"          # a row is there: roll back, then `decide` on the same connection


class ProcessedRowGone(RuntimeError):
    """The row that made the processed INSERT clash was gone when read (purged meanwhile):
    nothing is known about the message; it is consumed again later."""


def may_run_again(status: ProcessedStatus, msg: Message) -> bool:
    """Whether a message with a processed row of `status` runs its handler again: a dead
    letter always (nothing decided it), a rejection only when the producer re-sent it."""
    return (status is ProcessedStatus.DEAD_LETTERED
            or (status is ProcessedStatus.FAILED and msg.resend))


@dataclasses.dataclass(frozen=True)
class OwedReceipt:
    """A receipt the processed table says is still owed to a producer."""

    message_id: str
    producer: str
    status: ProcessedStatus
    error: str | None
    due_at: dt.datetime


class ProcessedStore:
    """Reads and writes one consumer group's rows of the processed table."""

    def __init__(self, engine: Engine, group: str, *, table: str = DEFAULT_PROCESSED_TABLE
                 ) -> None:
        self.engine = engine
        self.group = group
        self.table = processed_table(sa.MetaData(), table)
        t = self.table
        mine = (t.c.consumer_group == group) & (t.c.message_id == sa.bindparam("b_id"))
        # built once: executing them with parameter dicts skips per-message statement building
        self._insert = sa.insert(t)
        #: the claim's INSERT as driver SQL, by dialect (None: the driver needs the Core one)
        self._insert_driver = DriverSQL(lambda _dialect, _variant: self._insert)
        self._status = sa.select(t.c.status).where(mine)
        self._rerun = (sa.update(t).where(mine, t.c.status.in_(
            [ProcessedStatus.FAILED.value, ProcessedStatus.DEAD_LETTERED.value]))
                       .values(status=sa.bindparam("b_status"), error=sa.bindparam("b_error"),
                               attempts=t.c.attempts + 1, processed_at=sa.bindparam("b_now"),
                               receipt_due_at=sa.bindparam("b_due"), receipt_attempts=0))
        self._requeue = (sa.update(t).where(mine, t.c.src.is_not(None))
                         .values(receipt_due_at=sa.bindparam("b_now")))

    def _row(self, msg: Message, status: ProcessedStatus, error: str | None,
             receipt: bool) -> dict[str, Any]:
        now = utcnow()
        # (`stored_text`: a NUL in tags, say, made every write of the row fail on PostgreSQL)
        return {
            "consumer_group": self.group, "message_id": msg.id[:MESSAGE_ID_LEN],
            "topic": stored_text(msg.topic[:TOPIC_LEN]),
            "tags": (msg.tags or None) and stored_text(msg.tags[:TAGS_LEN]),
            "broker_message_id": stored_text(msg.broker_message_id[:MESSAGE_ID_LEN]) or None,
            # fitted as the others: a longer ckit_src (no producer's name: its receipt topic
            # would pass RocketMQ's 127) made every write of the row fail
            "src": (msg.producer or None) and stored_text(msg.producer[:NAME_LEN]),
            "status": status.value, "attempts": msg.reconsume_times + 1,
            "error": error and stored_text(error), "first_seen_at": now, "processed_at": now,
            "receipt_due_at": now if receipt and msg.producer else None, "receipt_attempts": 0,
        }

    def claim(self, conn: Connection, msg: Message, status: ProcessedStatus,
              error: str | None = None, *, receipt: bool = False) -> RowClaim:
        """Insert the row for `msg` in `conn`'s transaction: NEW, or TAKEN when a row is there
        already. After TAKEN nothing was written, and the caller rolls its transaction back
        (PostgreSQL has aborted it) and asks `decide` on the same connection what the row
        says."""
        try:
            row = self._row(msg, status, error, receipt)
            sql = self._insert_driver.sql(conn, row)  # (`_row` gives the same columns)
            if sql is None:
                conn.execute(self._insert, row)
            else:  # every message's one statement: the driver's cursor, as publish's
                execute(conn, sql, row)
            return RowClaim.NEW
        except IntegrityError:
            return RowClaim.TAKEN

    def decide(self, conn: Connection, msg: Message) -> RowClaim:
        """What the row that made `claim` answer TAKEN says, read in a transaction of its own
        on `conn` (whose transaction the caller has rolled back): RERUN (a row without effect
        that may run again: run it in a fresh transaction that starts with `rerun`), DONE or
        DECIDED. Read on the same connection, never a second one while it is held: consume
        threads outnumbering the pool's connections would each hold one and wait for another.

        Raises:
            ProcessedRowGone: the row is not there any more (purged meanwhile).
        """
        with conn.begin():
            found = conn.execute(self._status, {"b_id": msg.id[:MESSAGE_ID_LEN]}).scalar()
        if not found:
            raise ProcessedRowGone(f"message {msg.id}: its processed row clashed, then was "
                                   "gone when read (purged meanwhile?); consumed again later")
        status = ProcessedStatus(found)
        if may_run_again(status, msg):
            return RowClaim.RERUN
        return RowClaim.DONE if status is ProcessedStatus.SUCCEEDED else RowClaim.DECIDED

    def rerun(self, conn: Connection, msg: Message, status: ProcessedStatus,
              error: str | None = None, *, receipt: bool = False) -> bool:
        """Take a FAILED or DEAD_LETTERED row over in `conn`'s transaction (it holds the row
        lock until commit); False when it changed meanwhile (another consumer's run won)."""
        now = utcnow()
        return bool(conn.execute(self._rerun, {
            "b_id": msg.id[:MESSAGE_ID_LEN], "b_status": status.value,
            "b_error": error and stored_text(error), "b_now": now,
            "b_due": now if receipt and msg.producer else None}).rowcount)

    def record(self, msg: Message, status: ProcessedStatus, error: str | None = None, *,
               receipt: bool = False) -> bool:
        """Write the row in a transaction of its own (a rejection, a dead letter, a handler
        without a session); a row that may run again is taken over. False when the message is
        processed already."""
        with checkin.connection(self.engine) as conn:
            with conn.begin() as tx:
                claim = self.claim(conn, msg, status, error, receipt=receipt)
                if claim is RowClaim.NEW:
                    return True
                tx.rollback()
            claim = self.decide(conn, msg)
            if claim in (RowClaim.DONE, RowClaim.DECIDED):
                return False
            with conn.begin():
                return self.rerun(conn, msg, status, error, receipt=receipt)

    def status(self, message_id: str, conn: Connection | None = None) -> ProcessedStatus | None:
        """The recorded (committed) status of `message_id` for this group, or None. Read on
        `conn` (idle: in a transaction of its own) when given, else on a pooled connection."""
        params = {"b_id": message_id[:MESSAGE_ID_LEN]}
        if conn is not None:
            with conn.begin():
                found = conn.execute(self._status, params).scalar()
        else:
            with self.engine.connect() as pooled:
                found = pooled.execute(self._status, params).scalar()
        return ProcessedStatus(found) if found else None

    # -- the receipt outbox -------------------------------------------------------------------

    def requeue_receipt(self, message_id: str) -> ProcessedStatus | None:
        """Owe the receipt of `message_id` again (a re-sent message: the producer is waiting);
        return the row's status, None when there is no row or no producer to answer."""
        with self.engine.begin() as conn:
            params = {"b_id": message_id[:MESSAGE_ID_LEN], "b_now": utcnow()}
            if not conn.execute(self._requeue, params).rowcount:
                return None
            found = conn.execute(self._status, params).scalar()
        return ProcessedStatus(found) if found else None

    def claim_owed(self, *, due_before: dt.datetime, hold: dt.timedelta, limit: int
                   ) -> list[OwedReceipt]:
        """Receipts owed since before `due_before`, oldest first, each pushed `hold` into the
        future (so other consumers of the group, and the next scan, leave them to us for that
        long). Three statements whatever the count: the candidates, one guarded UPDATE (a row
        re-queued or taken by another scan meanwhile is due later than `due_before`, so it is
        left alone) stamping them with this scan's own time, and the rows carrying that stamp."""
        t = self.table
        mine = utcnow() + hold
        with self.engine.begin() as conn:
            ids = conn.execute(
                sa.select(t.c.message_id)
                .where(t.c.consumer_group == self.group, t.c.receipt_due_at <= due_before)
                .order_by(t.c.receipt_due_at).limit(limit)).scalars().all()
            if not ids:
                return []
            conn.execute(sa.update(t).where(
                t.c.consumer_group == self.group, t.c.message_id.in_(list(ids)),
                t.c.receipt_due_at <= due_before).values(receipt_due_at=mine))
            rows = conn.execute(
                sa.select(t.c.message_id, t.c.src, t.c.status, t.c.error)
                .where(t.c.consumer_group == self.group, t.c.message_id.in_(list(ids)),
                       t.c.receipt_due_at == mine)).all()
        return [OwedReceipt(r.message_id, r.src, ProcessedStatus(r.status), r.error, mine)
                for r in rows if r.src]

    def receipts_sent(self, message_ids: Sequence[str]) -> int:
        """Nothing is owed for these any more (one UPDATE)."""
        t = self.table
        if not message_ids:
            return 0
        with self.engine.begin() as conn:
            return int(conn.execute(sa.update(t).where(
                t.c.consumer_group == self.group, t.c.message_id.in_(list(message_ids)),
                t.c.receipt_due_at.is_not(None)).values(receipt_due_at=None)).rowcount)

    def receipts_failed(self, message_ids: Sequence[str], retry_at: dt.datetime) -> None:
        """Delivery failed: owe them again from `retry_at`, one attempt more."""
        t = self.table
        with self.engine.begin() as conn:
            conn.execute(sa.update(t).where(
                t.c.consumer_group == self.group, t.c.message_id.in_(list(message_ids)),
                t.c.receipt_due_at.is_not(None)).values(
                receipt_due_at=retry_at, receipt_attempts=t.c.receipt_attempts + 1))

    def owed(self) -> int:
        """Receipts still owed by this group (the `(consumer_group, receipt_due_at)` index)."""
        t = self.table
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t).where(
                t.c.consumer_group == self.group, t.c.receipt_due_at.is_not(None))).scalar()
                or 0)

    # -- retention ----------------------------------------------------------------------------

    def purge(self, older_than: dt.timedelta, *, batch: int = 1000,
              max_batches: int | None = None, pause: float = 0.0) -> int:
        """Delete this group's rows processed before `now - older_than`, in bounded batches
        picked oldest first (the `processed_at` index), each deleted by primary key, with
        `pause` seconds between batches; rows whose receipt is still owed are kept."""
        t = self.table
        horizon = utcnow() - older_than
        deleted = batches = 0
        with committed_on_error(lambda: counted(deleted, "processed row", "deleted", batches)):
            while max_batches is None or batches < max_batches:
                with self.engine.begin() as conn:
                    keys = conn.execute(
                        sa.select(t.c.message_id).where(t.c.consumer_group == self.group,
                                                        t.c.processed_at < horizon,
                                                        t.c.receipt_due_at.is_(None))
                        .order_by(t.c.processed_at).limit(batch)
                    ).scalars().all()
                    if not keys:
                        break
                    gone = conn.execute(sa.delete(t).where(
                        t.c.consumer_group == self.group, t.c.message_id.in_(keys),
                        t.c.receipt_due_at.is_(None))).rowcount
                deleted += gone  # counted once committed
                batches += 1
                if len(keys) < batch:
                    break
                if pause:
                    time.sleep(pause)
        return deleted
