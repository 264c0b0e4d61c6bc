"""The relay: re-sends whatever is still due in the outbox, in batches, until told to stop."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import threading
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine, read_committed
from consumer_kit.core.db_clock import ClockWatch
from consumer_kit.core.db_errors import describe, is_conflict, is_transient
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.schema import DEFAULT_OUTBOX_TABLE, outbox_table
from consumer_kit.core.stop_wait import wait_for_stop
from consumer_kit.transports.base import Transport
from outbox_producer import metrics
from outbox_producer.backoff import Backoff
from outbox_producer.claim import (
    DEFAULT_LEASE,
    Claimer,
    Shard,
    check_lease,
    default_owner,
    send_deadline,
)
from outbox_producer.locked import CLAIM_MODES, LockedSender
from outbox_producer.replica import DEFAULT_SWEEP_EVERY, ReplicaClaimer
from outbox_producer.send_stats import SendStats, committed_part, unmarked_text
from outbox_producer.sender import Sender
from outbox_producer.shard_lock import ShardAnnouncement

log = logging.getLogger(__name__)

DEFAULT_BATCH = 200
DEFAULT_IDLE_SLEEP = 0.5
#: how often a running relay refreshes the backlog gauges
METRICS_INTERVAL = 30.0
#: wait after a database or broker outage: doubles up to the cap
OUTAGE_BACKOFF = (0.5, 30.0)
#: A claim that lost to another relay's (a deadlock; on a Galera cluster, a relay on another node
#: certified first) sent nothing: claim again at once, after a pause of up to CLAIM_AGAIN_JITTER
#: seconds, doubled with each loss in a row (so that the two fall out of step, and a node that
#: has not applied the other's claim yet catches up), up to CLAIM_AGAIN_TIMES in a row; more
#: than that in a row is waited out as an outage. (`--claim lock` is not claimed again: a
#: conflict there may come after its sends.)
CLAIM_AGAIN_TIMES = 8
CLAIM_AGAIN_JITTER = 0.01
#: `run(once=True)` gives up (result.gave_up) after an outage this long, so `--once` ends
DEFAULT_ONCE_OUTAGE_LIMIT = 30.0


#: the lowest `max_rate`: one send a day (a lower one made the wait overflow the clock, after
#: the first send, with a row left claimed)
MIN_RATE = 1 / 86400


class RateLimiter:
    """A token bucket: `acquire()` blocks so that at most `rate` sends happen per second."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next_at = time.monotonic()
        self._lock = threading.Lock()  # the relay's worker threads share one bucket

    def acquire(self, stop: threading.Event) -> bool:
        """Take the next token and wait for its time (True). False, at once, when `stop` is
        set while that time is still to come: the caller sends nothing more (a stopping relay
        must not send the rest of its batch in a burst)."""
        with self._lock:  # each caller its own slot: concurrent workers never share one
            now = time.monotonic()
            slot = max(self.next_at, now)
            self.next_at = slot + self.interval
        return not (slot > now and wait_for_stop(stop, slot - now))


@dataclasses.dataclass
class RelayResult:
    """Totals of one `run` (or `run_once`)."""

    batches: int = 0
    stats: SendStats = dataclasses.field(default_factory=SendStats)
    errors: int = 0
    #: with `once`: the outage that outlasted `once_outage_limit` (the run stopped early)
    gave_up: str | None = None

    def add(self, other: RelayResult) -> None:
        """Accumulate another loop's totals."""
        self.batches += other.batches
        self.stats.add(other.stats)
        self.errors += other.errors
        self.gave_up = self.gave_up or other.gave_up

    @classmethod
    def total(cls, parts: list[RelayResult]) -> RelayResult:
        """The totals of several loops' (or relays') results."""
        total = cls()
        for part in parts:
            total.add(part)
        return total

    def committed(self) -> str | None:
        """What the batches so far committed, for an error that stops the run part way
        (`core.progress`): "12 messages sent, 1 retried in 3 batches", then the sends whose
        marks were lost ("..., and 2 sent but not marked SENT (...)"), or None for nothing."""
        outcomes = [counted(self.stats.sent, "message", "sent"),
                    self.stats.retried and f"{self.stats.retried:,} retried",
                    self.stats.failed and f"{self.stats.failed:,} failed"]
        done = ", ".join(o for o in outcomes if o)
        if done:
            done = f"{done} in {self.batches:,} batch{'' if self.batches == 1 else 'es'}"
        if self.stats.unmarked:
            lost = unmarked_text(self.stats.unmarked)
            done = f"{done}, and {lost}" if done else lost
        return done or None


class ClaimLost(Exception):
    """A claim rolled back because a concurrent one won (`db_errors.is_conflict`): nothing was
    claimed or sent."""

    def __init__(self, error: sa.exc.DBAPIError) -> None:
        super().__init__(f"claim lost to another relay's: {describe(error)}")
        self.error = error


class Relay:
    """Claims due outbox rows in batches, sends them, and marks each outcome.

    Several relays (threads or processes) can run side by side: claims are row locks with
    SKIP LOCKED (MariaDB >= 10.6, MySQL 8, PostgreSQL) or an optimistic token claim (SQLite), so
    no row is sent twice in the normal case. `shard` restricts a relay to `MOD(id, N) = i`
    (`run` refuses it beside a running relay of the outbox with another N: `shard_lock`).
    `read_engine` (a read replica of `engine`) takes the scans for due rows and the backlog
    gauges; claims, sends and marks stay on `engine`, and a primary sweep every `sweep_every`
    seconds finds what a lagging replica hides (`outbox_producer.replica`).

    >>> relay = Relay(engine, transport, batch=500)          # doctest: +SKIP
    >>> relay.run_once()                                     # drain what is due, then return
    """

    def __init__(
        self,
        engine: Engine | str,
        transport: Transport,
        *,
        table: str = DEFAULT_OUTBOX_TABLE,
        batch: int = DEFAULT_BATCH,
        shard: Shard | None = None,
        max_rate: float | None = None,
        lease: dt.timedelta = DEFAULT_LEASE,
        backoff: Backoff | None = None,
        failed_retry_after: dt.timedelta | None = None,
        idle_sleep: float = DEFAULT_IDLE_SLEEP,
        owner: str | None = None,
        workers: int = 1,
        once_outage_limit: float = DEFAULT_ONCE_OUTAGE_LIMIT,
        read_engine: Engine | str | None = None,
        sweep_every: float = DEFAULT_SWEEP_EVERY,
        claim: str = "lease",
    ) -> None:
        if batch < 1 or workers < 1:
            raise ConfigError("batch and workers must be at least 1")
        check_lease(lease)
        if claim not in CLAIM_MODES:
            raise ConfigError(f"unknown claim mode {claim!r}: use {' or '.join(CLAIM_MODES)}")
        if claim == "lock" and read_engine is not None:
            raise ConfigError("--claim lock reads and locks on the primary: it takes no "
                              "--read-url (use --claim lease with a replica)")
        if claim == "lock" and max_rate is not None and max_rate * lease.total_seconds() < 4:
            raise ConfigError(
                f"--claim lock holds a batch's rows while it paces its sends: --max-rate "
                f"{max_rate:g} with --lease {lease.total_seconds():g}s leaves under 2 sends per "
                f"half lease; raise either, or use --claim lease")
        if max_rate is not None and not (MIN_RATE <= max_rate < float("inf")):
            raise ConfigError(f"max_rate must be a finite number of sends per second, at least "
                              f"one a day ({MIN_RATE:.3g}), not {max_rate}")
        self.once_outage_limit = once_outage_limit
        self.engine = read_committed(make_engine(engine))
        self.table = outbox_table(sa.MetaData(), table)
        self.owner = owner or default_owner("relay")
        self.batch = batch
        self.workers = workers
        self.idle_sleep = idle_sleep
        self.read_engine = make_engine(read_engine) if read_engine is not None else None
        if self.read_engine is None:
            self.claimer = Claimer(self.engine, self.table, self.owner, lease=lease, shard=shard,
                                   retry_failed=failed_retry_after is not None)
        else:
            self.claimer = ReplicaClaimer(self.engine, self.table, self.owner, lease=lease,
                                          shard=shard, retry_failed=failed_retry_after is not None,
                                          read_engine=self.read_engine, sweep_every=sweep_every)
        self.sender = Sender(self.engine, self.table, transport, self.owner,
                             backoff or Backoff(), failed_retry_after)
        self.locked = (LockedSender(self.claimer, self.sender, lease) if claim == "lock"
                       else None)
        self.limiter = RateLimiter(max_rate) if max_rate else None
        self.stopping = threading.Event()
        self._metrics_lock = threading.Lock()
        #: the current (or last) run's totals, one per loop, added to as batches commit
        self.progress: list[RelayResult] = [RelayResult()]
        self._next_metrics = 0.0
        self.clock = ClockWatch(self.engine, lease, "relay", metrics.CLOCK_OFFSET.labels(
            metrics.database_label(self.engine)).set)
        self.shards = ShardAnnouncement(self.engine, self.table, shard)  # peers share N

    def stop(self) -> None:
        """Ask `run` to return after the current batch (safe from a signal handler: `run`
        waits for it without taking the event's lock on the main thread): without
        `max_rate` it sends the rest of that batch; with it, the rows still to wait for their
        turn are released instead (back to the state they were claimed from, no retry
        counted), so the cap holds to the last send."""
        self.stopping.set()

    def step(self) -> SendStats | None:
        """Claim and send one batch; None when nothing was due.

        Raises:
            ClaimLost: the claim was rolled back because a concurrent one won; nothing was
                claimed or sent (`run` claims again).
            sqlalchemy.exc.DBAPIError: any other database error.
        """
        claim_size = self.batch
        if self.limiter is not None:  # never hold leases on more rows than we may send soon
            claim_size = max(1, min(self.batch, int(1 / self.limiter.interval) or 1))
        limiter = self.limiter
        pace = None if limiter is None else (lambda: limiter.acquire(self.stopping))
        if self.locked is not None:
            return self.locked.step(claim_size, pace=pace)
        started = time.monotonic()  # (before the claim: never later than the lease's start)
        try:
            rows = self.claimer.claim(claim_size)
        except sa.exc.DBAPIError as exc:
            if is_conflict(exc, self.engine.dialect.name):
                raise ClaimLost(exc) from exc
            raise
        if not rows:
            return None
        # oldest first (PostgreSQL's RETURNING keeps no order): rows an outage released lead
        # the next batch, where a success after them tells a failure from an outage (`Sender`)
        rows.sort(key=lambda row: row.id)
        return self.sender.send_rows(rows, pace=pace,
                                     deadline=send_deadline(started, self.claimer.lease))

    def run(self, *, once: bool = False, max_batches: int | None = None) -> RelayResult:
        """Loop until `stop()` (or, with `once`, until nothing is due). Outages of the database
        or broker are logged and waited out with a doubling back-off (with `once`, for at most
        `once_outage_limit` seconds: then `gave_up` says why). A broker outage puts the
        batch's unsent rows back to PENDING without counting a retry; after a database outage
        claimed rows keep their lease and are reclaimed when it expires, so nothing is lost
        (with `claim="lock"` they were never written: the rolled-back rows are due at once).
        A database error that waiting cannot fix (`core.db_errors`: a schema, permission,
        integrity or trigger error) is raised at once, marked with what the batches before it
        had sent (`core.progress.committed_before`). A `shard` refused raises `ConfigError`.

        With `workers > 1` that many loops run on threads of this process; their claims never
        overlap (row locks or claim tokens). The backlog gauges are refreshed when the loops
        start, every METRICS_INTERVAL (by one loop), and once more when they have all returned.

        With `once`, FAILED rows (the slow retry) are claimed only when due by the start of
        the run: one that fails again, due again at once (`failed_retry_after` of 0), waits for
        the next run, so the run ends."""
        self.shards.ensure()  # a running peer of another --shard N: refused, nothing claimed
        self.claimer.failed_due_by = utcnow() if once else None
        self.clock.check()  # warns when this host's clock would misjudge other relays' leases
        # each loop's totals as they grow: an error that stops the run says what they committed
        self.progress = [RelayResult() for _ in range(self.workers)]
        try:
            with committed_on_error(lambda: RelayResult.total(self.progress).committed()):
                return self._run(once, max_batches)
        finally:
            self.claimer.failed_due_by = None
            self.shards.release()
            self._refresh_metrics()

    def _run(self, once: bool, max_batches: int | None) -> RelayResult:
        if self.workers == 1:
            return self._loop(once, max_batches, self.progress[0])
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                self._loop(once, max_batches, self.progress[i])
            except BaseException as exc:  # re-raised below, once the other loops stopped
                if not errors:
                    self.stopping.set()
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,), name=f"ckit-relay-{i}")
                   for i in range(self.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stopping.clear()  # (set above to end the other loops, not by stop())
            raise errors[0]
        return RelayResult.total(self.progress)

    def _loop(self, once: bool, max_batches: int | None, result: RelayResult) -> RelayResult:
        """Claim and send batches until told to stop (or, with `once`, until nothing is
        due), adding up their totals in `result` as they commit; return it."""
        outage_wait = OUTAGE_BACKOFF[0]
        outage_since: float | None = None
        swept = False
        lost_in_a_row = 0
        while not self.stopping.is_set():
            self._refresh_metrics_when_due()
            if max_batches is not None and result.batches >= max_batches:
                break
            what = None
            try:
                stats = self.step()
                lost_in_a_row = 0  # (a batch, or nothing due: the lost claims are not in a row)
            except ClaimLost as lost:
                metrics.CLAIMS_LOST.inc()
                lost_in_a_row += 1
                if lost_in_a_row <= CLAIM_AGAIN_TIMES:
                    log.debug("relay %s: %s; claiming again", self.owner, lost)
                    wait_for_stop(self.stopping, random.uniform(
                        0, CLAIM_AGAIN_JITTER * 2 ** (lost_in_a_row - 1)))
                    continue
                stats, what = None, f"{lost} ({lost_in_a_row} in a row)"
            except Exception as exc:
                partial = committed_part(exc)  # marks of the batch committed before it
                if partial is not None:
                    if partial.committed():  # (sends whose marks were lost commit nothing)
                        result.batches += 1
                    result.stats.add(partial)
                # a bug or a schema, permission or integrity problem: waiting cannot fix it
                if not isinstance(exc, sa.exc.DBAPIError) or not is_transient(
                        exc, self.engine.dialect.name):
                    raise
                stats = None
                what = "database error: " + describe(exc) + (
                    f"; {unmarked_text(partial.unmarked)}" if partial and partial.unmarked
                    else "")
            if stats is not None and stats.outage:
                result.batches += 1
                result.stats.add(stats)
                what = stats.outage
            if what is not None:
                lost_in_a_row = 0  # (an outage, waited out: lost claims after it start a new run)
                result.errors += 1
                now = time.monotonic()
                outage_since = outage_since if outage_since is not None else now
                if once and now - outage_since >= self.once_outage_limit:
                    result.gave_up = what
                    log.error("relay %s: gave up after %.0fs of outage (--once): %s",
                              self.owner, now - outage_since, what)
                    break
                log.warning("relay %s: %s; retry in %.1fs", self.owner, what, outage_wait)
                wait_for_stop(self.stopping, outage_wait)
                outage_wait = min(outage_wait * 2, OUTAGE_BACKOFF[1])
                continue
            outage_wait = OUTAGE_BACKOFF[0]
            outage_since = None
            if stats is None:
                if once and not swept and isinstance(self.claimer, ReplicaClaimer) \
                        and self.claimer.sweep_next():
                    swept = True  # nothing on the replica: a last look at the primary
                    continue
                if once:
                    break
                wait_for_stop(self.stopping, self.idle_sleep)
                continue
            result.batches += 1
            result.stats.add(stats)
        return result

    def _refresh_metrics_when_due(self) -> None:
        """Refresh the gauges, measure the clock and announce the shard again once per
        METRICS_INTERVAL per relay, not per loop (the first time: just after `run` did)."""
        with self._metrics_lock:
            now = time.monotonic()
            if now < self._next_metrics:
                return
            first, self._next_metrics = not self._next_metrics, now + METRICS_INTERVAL
        self._refresh_metrics()
        if not first:
            self.clock.check()
            self.shards.ensure()  # (not yet taken: the database was down; lost: a restart)

    def _refresh_metrics(self) -> None:
        try:
            metrics.refresh_backlog(self.read_engine or self.engine, self.table,
                                    metrics.database_label(self.engine))
        except sa.exc.DBAPIError as exc:  # a metric must never stop the relay
            log.debug("relay %s: backlog metrics skipped: %s", self.owner, exc)

    def run_once(self) -> RelayResult:
        """Drain what is due now, then return."""
        return self.run(once=True)
