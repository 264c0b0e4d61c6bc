"""The in-process dispatcher: sends rows right after their transaction commits.

`Outbox.publish` hands committed rows here (SQLAlchemy `after_commit`); a worker thread claims
them with a compare-and-set (so a relay that got there first wins), sends and marks them. A crash
leaves them PENDING: the relay sends them later. Nothing here blocks the caller's commit.
With `check_topic`, a batch this dispatcher could not send in full schedules a delayed check
message naming its rows (`outbox_producer.checks`): the check, not a poll, re-sends them. With
`check_every_batch` every batch schedules its check before it is sent (seed 001's literal
design: a crash in the middle of a send is covered too, for one more message per batch). The
check comes due when a failed send's first retry is (`check_after` by default: the back-off's
first step with its jitter), or, for every batch, once a send lease has run out.

The dispatcher's send leases are written with its host's clock and judged by the relays' (a
relay takes a row whose lease it sees expired), so the worker measures its host's clock against
the database's after its first batch and then at most every `CLOCK_CHECK_EVERY` seconds, once a
batch is handled (never on the caller's thread, and `flush` does not wait for it), and warns
beyond a quarter of the lease, as a relay does (`consumer_kit.core.db_clock`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.batching import BatchWorker
from consumer_kit.core.db import make_engine, read_committed
from consumer_kit.core.db_clock import ClockWatch
from consumer_kit.core.db_errors import describe, is_transient
from consumer_kit.core.errors import CkitError, ConfigError
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.schema import DEFAULT_OUTBOX_TABLE, outbox_table
from consumer_kit.transports.base import Transport
from outbox_producer import metrics
from outbox_producer.backoff import Backoff
from outbox_producer.checks import (
    DEFAULT_CHECK_AFTER,
    CheckScheduler,
    database_key,
    first_retry_due,
)
from outbox_producer.claim import (
    DEFAULT_LEASE,
    Claimer,
    check_lease,
    default_owner,
    send_deadline,
)
from outbox_producer.sender import Sender

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 100
DEFAULT_QUEUE_SIZE = 10_000
#: seconds between two measurements of this host's clock against the database's
CLOCK_CHECK_EVERY = 60.0


class Dispatcher:
    """Background sender for freshly committed outbox rows.

    >>> dispatcher = Dispatcher(engine, transport).start()              # doctest: +SKIP
    >>> outbox = Outbox(engine, producer="orders", dispatcher=dispatcher)  # doctest: +SKIP

    Raises:
        ConfigError: a lease under `MIN_LEASE`, or an engine whose pool is a `StaticPool`: it
            hands every thread one driver connection, so the dispatcher's thread would commit
            the transaction a caller has open on it (the caller's rollback then undoes nothing).
    """

    def __init__(
        self,
        engine: Engine | str,
        transport: Transport,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        max_batch: int = DEFAULT_MAX_BATCH,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        lease: dt.timedelta = DEFAULT_LEASE,
        backoff: Backoff | None = None,
        check_topic: str | None = None,
        check_after: float | None = None,
        check_every_batch: bool = False,
    ) -> None:
        check_lease(lease)
        self.engine = read_committed(_own_connections(make_engine(engine)))
        self.table = outbox_table(sa.MetaData(), table)
        self.owner = default_owner("dispatcher")
        self.claimer = Claimer(self.engine, self.table, self.owner, lease=lease)
        backoff = backoff or Backoff()
        self.sender = Sender(self.engine, self.table, transport, self.owner, backoff)
        if check_after is None:  # a crash mid-send: after the lease; a failed send: its retry
            check_after = (max(DEFAULT_CHECK_AFTER, lease.total_seconds() + 1)
                           if check_every_batch else first_retry_due(backoff))
        self.checks = (CheckScheduler(transport, check_topic, database_key(self.engine),
                                      check_after) if check_topic else None)
        self.check_every_batch = check_every_batch
        self.clock = ClockWatch(self.engine, lease, "dispatcher",
                                metrics.DISPATCHER_CLOCK_OFFSET.labels(
                                    metrics.database_label(self.engine)).set)
        self._next_clock_check = 0.0  # (monotonic) the first batch measures
        self._said_idle = False  # rows were handed over while no thread ran (said once)
        self.worker: BatchWorker[OutboxRow] = BatchWorker(
            self._handle, name="ckit-dispatcher", max_batch=max_batch, queue_size=queue_size,
            after=self._check_clock_when_due)

    def start(self) -> Dispatcher:
        """Start the worker thread; returns self."""
        self.worker.start()
        return self

    def submit(self, rows: Sequence[OutboxRow]) -> None:
        """Queue committed rows for sending. Never blocks: when the queue is full, or the
        dispatcher was never started or is closed, the rows are left PENDING for the relay
        (logged; the latter once)."""
        if not self.worker.started:  # else they would wait in memory, bodies and all, for ever
            if rows and not self._said_idle:
                self._said_idle = True
                log.warning("message %s: the dispatcher is not running (never started, or "
                            "closed): committed rows are left to the relay; call "
                            "Dispatcher.start()", rows[0].message_id)
            return
        for row in rows:
            if not self.worker.submit(row):
                log.warning("message %s: dispatcher queue full, left for the relay",
                            row.message_id)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted row was handled; True when the queue drained in time."""
        return self.worker.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to `timeout`), then stop the worker."""
        self.worker.close(timeout)

    def _check_clock_when_due(self) -> None:
        """After a batch: measure the clock if `CLOCK_CHECK_EVERY` has passed (the first batch:
        at once). A measurement that fails is said in one line and tried again next time."""
        now = time.monotonic()
        if now < self._next_clock_check:
            return
        self._next_clock_check = now + CLOCK_CHECK_EVERY
        try:
            self.clock.check()
        except Exception as exc:  # (an outage is already a debug line of ClockWatch's)
            log.warning("dispatcher: could not measure this host's clock against the "
                        "database's: %s", describe(exc))

    def _handle(self, batch: list[OutboxRow]) -> None:
        checked = self.checks is not None and self.check_every_batch
        if checked:  # before the send: a crash after it is covered too
            self._check(batch)
        try:
            started = time.monotonic()
            claimed = self.claimer.claim_rows(batch)
            if claimed:
                stats = self.sender.send_rows(
                    claimed, deadline=send_deadline(started, self.claimer.lease))
                if stats.outage:  # the unsent rows are PENDING again: the relay has them
                    log.warning("dispatcher: %s", stats.outage)
                if stats.sent < len(claimed) and not checked:
                    self._check(claimed)
        except CkitError as exc:  # e.g. the transport's tables are missing: rows left as they
            log.error("dispatcher: batch of %d left PENDING for the relay (first message %s): "
                      "%s", len(batch), batch[0].message_id, exc)
            if not checked:
                self._check(batch)
        except Exception as exc:  # the rows stay PENDING or SENDING under a lease: the relay
            if isinstance(exc, sa.exc.DBAPIError) and is_transient(exc, self.engine.dialect.name):
                log.warning("dispatcher: transient database error; batch of %d left for the "
                            "relay (first message %s): %s", len(batch), batch[0].message_id,
                            describe(exc))  # an outage, a deadlock, a timeout: no traceback
            else:
                log.exception("dispatcher: batch of %d left for the relay (first message %s)",
                              len(batch), batch[0].message_id)
            if not checked:
                self._check(batch)

    def _check(self, rows: Sequence[OutboxRow]) -> None:
        """Schedule the delayed check of `rows` (a no-op without `check_topic`)."""
        if self.checks is not None:
            self.checks.schedule([row.id for row in rows])


def _own_connections(engine: Engine) -> Engine:
    """`engine`, unless its pool gives the dispatcher's thread the connection its callers use.

    Raises:
        ConfigError: a `StaticPool` (one driver connection for every thread: SQLAlchemy's
            in-memory SQLite recipe with `check_same_thread=False`).
    """
    if isinstance(engine.pool, sa.pool.StaticPool):
        raise ConfigError(
            "the dispatcher cannot work on an engine with a StaticPool: it hands every thread "
            "one connection, so the dispatcher's commits, on its own thread, would commit "
            "whatever a caller's open transaction wrote (its rollback would then undo nothing). "
            "Give it an engine whose pool has a connection per thread (SQLite on a file, "
            "with its default pool)")
    return engine
