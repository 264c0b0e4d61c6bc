"""The SQL transport's consumer: a poller thread and `threads` worker threads per consumer.

The poller heartbeats, shares the group's queues with the other live members (RocketMQ's
circular allocation, leases in `<p>_queue_lease`), appends due scheduled messages, fetches batches
from the queues it owns into a bounded buffer, and commits offsets. Workers run the callback.

Per queue, the committed offset is the lowest offset fetched but not yet done (RocketMQ's
ProcessQueue): everything below it is done, so a restarted or new owner resumes there.
A queue is handed to another member only after its running callbacks finished and its offset
was committed, so in the normal case no message reaches two consumers.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from consumer_kit.core.errors import CkitError
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    DeliveryCallback,
    Subscription,
    Verdict,
    as_verdict,
    merge_expressions,
    retry_topic,
    tag_matches,
)
from consumer_kit.core.raised import describe_exception
from consumer_kit.transports.base import Consumer
from consumer_kit.transports.sql.group import GroupStore, QueueKey, allocate, new_member_id
from consumer_kit.transports.sql.ownership import QueueState, Work, hold_until_idle
from consumer_kit.transports.sql.rows import row_delivery

if TYPE_CHECKING:
    from consumer_kit.transports.sql import SqlTransport

log = logging.getLogger(__name__)

COMMIT_INTERVAL = 0.2
HANDOVER_INTERVAL = 0.25
ERROR_BACKOFF = 1.0


class SqlConsumer(Consumer):
    """A member of `group` consuming `subscriptions` and `%RETRY%group`.

    Raises (from `start`):
        SchemaError: the transport's tables are missing.
        TransportUnavailable: the database cannot be reached.
    """

    def __init__(self, transport: SqlTransport, group: str, subscriptions: Sequence[Subscription],
                 callback: DeliveryCallback, *, threads: int = 1) -> None:
        self.transport = transport
        self.group = group
        self.callback = callback
        self.threads = max(1, threads)
        self.settings = transport.settings
        self.expressions = merge_expressions(subscriptions)
        self.expressions[retry_topic(group)] = "*"
        self.member_id = new_member_id()
        self.store = GroupStore(transport.db, transport.tables, group, self.member_id,
                                self.settings.lease_seconds)
        self._beat_every = max(0.2, self.settings.lease_seconds / 3)
        self._cond = threading.Condition()
        self._buffer: collections.deque[Work] = collections.deque()
        self._max_buffer = self.settings.batch_size + self.threads
        #: set to wake the poller early: new messages (a local send) or a low buffer
        self._wake = threading.Event()
        self._fill_from = 0  # rotates which owned queue is fetched first
        self._owned: dict[QueueKey, QueueState] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_flight = 0
        self._rebalance_now = True
        self._next_promote = 0.0
        self._next_handover = 0.0
        self._wanted: set[QueueKey] = set()
        self._started = False

    def __repr__(self) -> str:
        return f"SqlConsumer(group={self.group!r}, member={self.member_id!r})"

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wake(self) -> None:
        """Make the poller look at the queues now instead of after its poll interval."""
        self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Join the group and start the poller and worker threads."""
        if self._started:
            return
        for topic in self.expressions:
            self.transport.ensure_topic(topic)
        self.store.heartbeat()
        self._started = True
        name = f"ckit-sql-{self.group}"
        self._threads = [threading.Thread(target=self._poll_loop, name=f"{name}-poll",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._work_loop, name=f"{name}-{i}",
                                           daemon=True) for i in range(self.threads)]
        for thread in self._threads:
            thread.start()
        log.info("consumer %s of %s started on %s", self.member_id, self.group,
                 ", ".join(self.expressions))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop fetching, let running callbacks finish (up to `timeout`), commit, release the
        queues and leave the group. Messages fetched but not started stay uncommitted. A queue
        whose callback still runs after `timeout` is committed up to it but not released: its
        lease runs out first (`lease_seconds`), so no other member gets that message while the
        callback may still apply it."""
        if not self._started or self._stop.is_set():
            return
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            states = list(self._owned.values())
            self._owned.clear()
            for state in states:
                state.active = False
        for state in states:
            try:
                if state.running:
                    self._keep_until_expiry(state)
                else:
                    self._give_up(state)
            except CkitError as error:
                log.warning("could not release %s/%d of %s: %s", *state.key, self.group, error)
        try:
            self.store.leave()
        except CkitError as error:
            log.warning("could not leave group %s: %s", self.group, error)
        log.info("consumer %s of %s stopped", self.member_id, self.group)

    # -- ready -----------------------------------------------------------------------------------

    def ready(self) -> int:
        """Messages not handed to a callback yet: deliverable now, or redeliveries of this group
        still waiting for their time (an over-estimate while other members of the group are
        busy, or when tags filter messages out)."""
        topics = list(self.expressions)
        heads = self.store.queues(topics)
        committed = self.store.committed_offsets(topics)
        count = self.store.count_due(topics, waiting=retry_topic(self.group))
        with self._cond:
            buffered = sum(1 for w in self._buffer if w.state.active)
            for key, head in heads.items():
                state = self._owned.get(key)
                low = state.cursor if state is not None and state.active else committed.get(key, 0)
                count += max(0, head - low)
        return count + buffered

    # -- poller ----------------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        next_beat = 0.0
        next_commit = 0.0
        while not self._stop.is_set():
            busy = False
            self._wake.clear()  # a wake from now on makes the wait below return at once
            try:
                now = time.monotonic()
                if now >= next_beat or self._rebalance_now:
                    self._rebalance_now = False
                    next_beat = now + self._beat_every
                    self._rebalance()
                elif now >= self._next_handover:
                    self._handover()
                if now >= next_commit:
                    next_commit = now + COMMIT_INTERVAL
                    self._commit()
                busy = self._fill()
            except CkitError as error:
                log.warning("consumer %s of %s: %s", self.member_id, self.group, error)
                self._stop.wait(ERROR_BACKOFF)
            except Exception:
                log.exception("consumer %s of %s: poller error", self.member_id, self.group)
                self._stop.wait(ERROR_BACKOFF)
            if not busy and not self._stop.is_set():
                self._wake.wait(self.settings.poll_interval)
        try:
            self._commit()
        except CkitError as error:
            log.warning("final commit of %s failed: %s", self.group, error)

    def _rebalance(self) -> None:
        members = self.store.heartbeat()
        heads = self.store.queues(self.expressions)
        wanted = allocate(list(heads), members, self.member_id)
        with self._cond:
            states = list(self._owned.values())
        deadline = time.monotonic() + self.settings.lease_seconds * 0.8  # before the renewal
        renewed = self.store.renew(s.lease for s in states)
        for state in states:
            lease = renewed.get(state.key)
            if lease is None:
                log.warning("consumer %s of %s lost queue %s/%d", self.member_id, self.group,
                            *state.key)
                with self._cond:
                    state.active = False
                    self._owned.pop(state.key, None)
                continue
            with self._cond:
                state.lease = lease
                state.lease_deadline = deadline
                if state.key not in wanted:
                    state.active = False
        self._wanted = wanted
        self._handover()
        self.store.check_subscriptions(self.expressions)  # after the renewals: never delays them

    def _handover(self) -> None:
        """Give up inactive queues whose callbacks finished; try to take the missing wanted
        ones (often held by a member that gives them up at its own next step)."""
        self._next_handover = time.monotonic() + HANDOVER_INTERVAL
        with self._cond:
            idle = [s for s in self._owned.values() if not s.active and s.running == 0]
        for state in idle:
            self._give_up(state)
        for key in sorted(self._wanted - set(self._owned)):
            self._take(key)

    def _give_up(self, state: QueueState) -> None:
        offset = state.commit_point()
        released = self.store.release(state.lease, offset if offset > state.committed else None)
        with self._cond:
            self._owned.pop(state.key, None)
        log.info("consumer %s of %s handed over %s/%d at offset %d (%s)", self.member_id,
                 self.group, *state.key, offset, "released" if released else "lost")

    def _keep_until_expiry(self, state: QueueState) -> None:
        """Commit what is done of a queue whose callback still runs, and keep its lease (a
        release hands the queue over at once) until the callback returns: a thread renews it,
        then commits and releases. Should this process end first, the lease runs out."""
        offset = state.commit_point()
        if offset > state.committed:
            self.store.commit({state.key: offset})
            state.committed = offset
        log.warning("consumer %s of %s: a callback on %s/%d still runs after the shutdown "
                    "timeout; the queue is handed over when it returns", self.member_id,
                    self.group, *state.key)
        threading.Thread(target=hold_until_idle, daemon=True, name=f"ckit-sql-{self.group}-hold",
                         args=(state, self.store, self._cond, self.settings.lease_seconds / 3,
                               self._give_up)).start()

    def _take(self, key: QueueKey) -> None:
        deadline = time.monotonic() + self.settings.lease_seconds * 0.8
        taken = self.store.acquire(key)
        if taken is None:
            return
        lease, offset = taken
        state = QueueState(key=key, lease=lease, expression=self.expressions[key[0]],
                            cursor=offset, committed=offset, lease_deadline=deadline)
        with self._cond:
            self._owned[key] = state
        log.info("consumer %s of %s took %s/%d at offset %d", self.member_id, self.group,
                 *key, offset)

    def _commit(self) -> None:
        with self._cond:
            points = {s.key: (s, s.commit_point()) for s in self._owned.values()}
        todo = {key: point for key, (s, point) in points.items() if point > s.committed}
        if not todo:
            return
        self.store.commit(todo)
        with self._cond:
            for state, point in points.values():
                state.committed = max(state.committed, point)

    def _fill(self) -> bool:
        """Promote due messages, fetch from owned queues into the buffer; True if any came.

        Only at low water (no more buffered than the workers can take at once), so each fetch
        can bring up to a whole batch; the workers wake the poller when they get there.
        """
        with self._cond:
            active = [s for s in self._owned.values() if s.active]
            low_water = len(self._buffer) <= self.threads
        if not active or not low_water:
            return False
        start = self._fill_from % len(active)  # no queue always first: none starves
        self._fill_from += 1
        active = active[start:] + active[:start]
        now = time.monotonic()
        if now >= self._next_promote:  # effect times need no finer grain than the poll interval
            self._next_promote = now + self.settings.poll_interval
            self.transport.promote_due([s.key for s in active])
        heads = self.store.queues({s.key[0] for s in active})
        fetched = False
        for state in active:
            head = heads.get(state.key)
            if head is None:
                self._rebalance_now = True
                continue
            with self._cond:
                room = self._max_buffer - len(self._buffer)
            if room <= 0:
                break
            if head <= state.cursor:
                continue
            rows = self.store.fetch(state.key, state.cursor, min(room, self.settings.batch_size))
            if not rows:  # purged below the head
                state.cursor = head
                continue
            work = []
            for row in rows:
                offset = int(row.queue_offset)
                if row.origin_topic is not None or tag_matches(state.expression, row.tags):
                    work.append(Work(state, offset,
                                      _delivery(row, self.transport.max_reconsume_times)))
            with self._cond:
                state.cursor = int(rows[-1].queue_offset) + 1
                state.pending.update(w.offset for w in work)
                self._buffer.extend(work)
                self._cond.notify_all()
            fetched = True
        return fetched

    # -- workers ---------------------------------------------------------------------------------

    def _next_work(self) -> Work | None:
        with self._cond:
            while not self._stop.is_set():
                if not self._buffer:
                    self._cond.wait(0.5)
                    continue
                work = self._buffer.popleft()
                if len(self._buffer) == self.threads:  # low water: time to fetch more
                    self._wake.set()
                state = work.state
                if state.active and time.monotonic() > state.lease_deadline:
                    # not renewed in time (database slow or away): stop, and let the poller
                    # release and re-take the queue, which re-fetches from the committed offset
                    state.active = False
                if not state.active:
                    continue  # the queue is being given up: its next owner delivers this
                state.running += 1
                self._in_flight += 1
                return work
        return None

    def _work_loop(self) -> None:
        while (work := self._next_work()) is not None:
            done = False
            try:
                done = self._process(work.delivery)
            finally:
                with self._cond:
                    work.state.running -= 1
                    self._in_flight -= 1
                    if done:
                        work.state.pending.discard(work.offset)
                    self._cond.notify_all()

    def _process(self, delivery: Delivery) -> bool:
        """Run the callback; on RECONSUME_LATER re-send to the retry topic. True when done."""
        try:
            verdict = as_verdict(self.callback(delivery))
        except Exception as error:  # the transport contract: an exception means RECONSUME_LATER
            log.exception("callback raised for message %s; reconsume later",
                          delivery.broker_message_id)
            verdict = Verdict(ConsumeStatus.RECONSUME_LATER, describe_exception(error))
        if verdict.status is ConsumeStatus.CONSUME_SUCCESS:
            return True
        while True:
            try:
                self.transport.reconsume_later(self.group, delivery, verdict.reason,
                                               spend=verdict.spend)
                return True
            except CkitError as error:
                log.warning("message %s: cannot schedule the retry yet: %s",
                            delivery.broker_message_id, error)
                if self._stop.wait(ERROR_BACKOFF):
                    return False  # stays uncommitted: delivered again after a restart


def _delivery(row: Any, max_reconsume_times: int) -> Delivery:
    return row_delivery(row, topic=row.origin_topic or row.topic,
                        reconsume_times=int(row.reconsume_times),
                        queue_offset=int(row.queue_offset),
                        max_reconsume_times=max_reconsume_times)
