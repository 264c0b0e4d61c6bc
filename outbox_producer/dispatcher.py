"""The in-process dispatcher: sends rows right after their transaction commits.

`Outbox.publish` hands committed rows here (SQLAlchemy `after_commit`); a worker thread claims
them with a compare-and-set (so a relay that got there first wins), sends and marks them. A crash
leaves them PENDING: the relay sends them later. Nothing here blocks the caller's commit.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.db import make_engine, read_committed
from consumer_kit.schema import DEFAULT_OUTBOX_TABLE, outbox_table
from consumer_kit.transports.base import Transport
from outbox_producer.backoff import Backoff
from outbox_producer.claim import Claimer, default_owner
from outbox_producer.sender import Sender, SendStats

log = logging.getLogger("consumer_kit.outbox.dispatcher")

DEFAULT_MAX_BATCH = 100
DEFAULT_QUEUE_SIZE = 10_000


class Dispatcher:
    """Background sender for freshly committed outbox rows.

    >>> dispatcher = Dispatcher(engine, transport).start()              # doctest: +SKIP
    >>> outbox = Outbox(engine, producer="orders", dispatcher=dispatcher)  # doctest: +SKIP
    """

    def __init__(
        self,
        engine: Engine | str,
        transport: Transport,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        max_batch: int = DEFAULT_MAX_BATCH,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        lease: dt.timedelta = dt.timedelta(seconds=30),
        backoff: Backoff | None = None,
    ) -> None:
        self.engine = read_committed(make_engine(engine))
        self.table = outbox_table(sa.MetaData(), table)
        self.owner = default_owner("dispatcher")
        self.claimer = Claimer(self.engine, self.table, self.owner, lease=lease)
        self.sender = Sender(self.engine, self.table, transport, self.owner, backoff or Backoff())
        self.max_batch = max_batch
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(queue_size)
        self.stats = SendStats()
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._outstanding = 0

    def start(self) -> Dispatcher:
        """Start the worker thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ckit-dispatcher", daemon=True)
            self._thread.start()
        return self

    def submit(self, rows: Sequence[dict[str, Any]]) -> None:
        """Queue committed rows for sending. Never blocks: when the queue is full the rows are
        left PENDING for the relay (logged)."""
        for row in rows:
            try:
                with self._idle:
                    self._outstanding += 1
                self.queue.put_nowait(row)
            except queue.Full:
                with self._idle:
                    self._outstanding -= 1
                log.warning("message %s: dispatcher queue full, left for the relay",
                            row["message_id"])

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted row was handled; True when the queue drained in time."""
        with self._idle:
            return self._idle.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to `timeout`), then stop the worker."""
        if self._thread is None:
            return
        self.flush(timeout)
        self.queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._handle(batch)
                    return
                batch.append(item)
            self._handle(batch)

    def _handle(self, batch: list[dict[str, Any]]) -> None:
        try:
            claimed = self.claimer.claim_ids(batch)
            if claimed:
                self.stats.add(self.sender.send_rows(claimed))
        except Exception:  # the rows stay PENDING or SENDING under a lease: the relay has them
            log.exception("dispatcher: batch of %d left for the relay (first message %s)",
                          len(batch), batch[0]["message_id"])
        finally:
            with self._idle:
                self._outstanding -= len(batch)
                self._idle.notify_all()
