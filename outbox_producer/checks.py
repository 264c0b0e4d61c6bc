"""Delayed checks instead of polling (seed 001: "a delayed message instead of the timed scan").

With `Dispatcher(..., check_topic=T)` the after-commit dispatcher sends one delayed **check
message** naming the ids of a batch it could not send in full (with `check_every_batch`: of
every batch, before sending it), on topic `T`, tag = the database's key, delay `check_after`.
When it comes due, a `Checker` in the relay process looks the rows up on the primary by id:
those sent meanwhile are done (one indexed lookup); those still due are claimed with the
relay's own claim narrowed to them (`CandidateClaimer`) and sent; those waiting for a back-off
or a live send lease get a new check at that time. The polling relay stays the fallback (a
crash before a check was sent, a check lost with its broker), run with a long `--idle-sleep`.

Each database has its own consumer group `ckit-check-<key>` subscribed to tag `<key>`, so
relays serving other databases never take its checks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import CkitError, ConfigError, TransportError
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
    Verdict,
)
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.base import Consumer, Transport
from outbox_producer.backoff import Backoff
from outbox_producer.candidates import CandidateClaimer
from outbox_producer.claim import DEFAULT_LEASE, default_owner, send_deadline
from outbox_producer.send_stats import SendStats
from outbox_producer.sender import Sender

log = logging.getLogger(__name__)

#: How long after the dispatcher took a batch its check comes due.
DEFAULT_CHECK_AFTER = 30.0
#: The shortest delay of a re-check (a row due again right away is checked this soon).
MIN_RECHECK = 1.0
_KEY = re.compile(r"^[A-Za-z0-9_-]{1,60}$")


def database_key(engine: Engine) -> str:
    """The tag naming `engine`'s database in check messages: its database name (a SQLite
    file's stem).

    Raises:
        ConfigError: a name a RocketMQ tag and group cannot carry.
    """
    name = engine.url.database or ""
    if engine.url.get_backend_name() == "sqlite":
        name = re.sub(r"\W", "_", name.rsplit("/", 1)[-1].split(".", 1)[0]) or "memory"
    if not _KEY.match(name):
        raise ConfigError(f"database name {name!r} cannot name a check group "
                          "(letters, digits, _ and -, at most 60)")
    return name


def first_retry_due(backoff: Backoff) -> float:
    """Seconds after a failed first send by when its retry is due, whatever the jitter."""
    return max(MIN_RECHECK, backoff.schedule[0] * (1 + backoff.jitter))


def check_group(key: str) -> str:
    """The consumer group that handles the checks of database `key`."""
    return f"ckit-check-{key}"


@dataclasses.dataclass(frozen=True)
class CheckRequest:
    """One check message: the outbox ids to look at in database `key`."""

    key: str
    ids: tuple[int, ...]

    def to_message(self, topic: str, delay: float) -> OutgoingMessage:
        """The delayed message carrying this request (tag = the database key)."""
        body = json.dumps({"db": self.key, "ids": list(self.ids)}, separators=(",", ":"))
        return OutgoingMessage(topic=topic, body=body.encode(), tags=self.key, delay=delay)

    @classmethod
    def parse(cls, body: bytes) -> CheckRequest | None:
        """The request in a check message's body, or None when it is not one."""
        try:
            data = json.loads(body)
            return cls(str(data["db"]), tuple(int(i) for i in data["ids"]))
        except (ValueError, KeyError, TypeError):
            return None


class CheckScheduler:
    """Sends check messages for rows of one database (the dispatcher's side)."""

    def __init__(self, transport: Transport, topic: str, key: str,
                 after: float = DEFAULT_CHECK_AFTER) -> None:
        if after <= 0:
            raise ConfigError(f"check delay must be positive, not {after}")
        self.transport, self.topic, self.key, self.after = transport, topic, key, after

    def schedule(self, ids: Sequence[int], delay: float | None = None) -> bool:
        """Send one check for `ids` due in `delay` seconds (default `after`); False when the
        transport refused it (logged: the polling relay is the fallback)."""
        if not ids:
            return True
        request = CheckRequest(self.key, tuple(ids))
        try:
            self.transport.send(request.to_message(self.topic, delay or self.after))
        except (TransportError, CkitError) as exc:
            log.warning("check of %d rows (first id %d) not scheduled, left to the polling "
                        "relay: %s", len(ids), ids[0], exc)
            return False
        return True


@dataclasses.dataclass
class CheckStats:
    """What the checks of one `Checker` found and did."""

    checks: int = 0
    rows: int = 0
    resent: int = 0
    rescheduled: int = 0
    send: SendStats = dataclasses.field(default_factory=SendStats)


class Checker:
    """Handles the check messages of one outbox table: re-sends rows still unsent.

    >>> checker = Checker(engine, table, transport, topic="ckit-check")  # doctest: +SKIP
    >>> consumer = checker.consumer(transport); consumer.start()       # doctest: +SKIP
    """

    def __init__(self, engine: Engine, table: sa.Table, transport: Transport, *, topic: str,
                 backoff: Backoff | None = None, lease: dt.timedelta = DEFAULT_LEASE,
                 after: float = DEFAULT_CHECK_AFTER, owner: str | None = None) -> None:
        self.engine, self.table = engine, table
        self.owner = owner or default_owner("check")
        self.key = database_key(engine)
        self.claimer = CandidateClaimer(engine, table, self.owner, lease=lease)
        self.sender = Sender(engine, table, transport, self.owner, backoff or Backoff())
        self.scheduler = CheckScheduler(transport, topic, self.key, after)
        self.stats = CheckStats()

    def consumer(self, transport: Transport, *, threads: int = 1) -> Consumer:
        """The transport consumer of this database's checks (group `ckit-check-<key>`)."""
        return transport.consumer(check_group(self.key),
                                  [Subscription(self.scheduler.topic, self.key)],
                                  self.handle, threads=threads)

    def handle(self, delivery: Delivery) -> ConsumeStatus | Verdict:
        """The consumer callback: never raises; RECONSUME_LATER (the transport's back-off)
        when the database or the broker is down."""
        request = CheckRequest.parse(delivery.body)
        if request is None or request.key != self.key:
            log.warning("ignoring a check message that is not for database %s: %r", self.key,
                        bytes(delivery.body[:200]))
            return ConsumeStatus.CONSUME_SUCCESS
        try:
            again = self.check(request.ids)
        except DBAPIError as exc:
            return Verdict(ConsumeStatus.RECONSUME_LATER, f"database error: {exc.orig or exc}")
        except Exception as exc:  # the callback must never raise
            log.exception("check of %d rows failed", len(request.ids))
            return Verdict(ConsumeStatus.RECONSUME_LATER, f"{type(exc).__name__}: {exc}")
        if again is not None:
            return Verdict(ConsumeStatus.RECONSUME_LATER, again)
        return ConsumeStatus.CONSUME_SUCCESS

    def check(self, ids: Sequence[int]) -> str | None:
        """Send the rows of `ids` still unsent and due; schedule a re-check for those waiting
        (a back-off, a live send lease). Returns why the check must be redelivered (a broker
        outage), else None."""
        self.stats.checks += 1
        self.stats.rows += len(ids)
        now = utcnow()
        waiting = self._open(ids)
        if not waiting:  # the normal case: the dispatcher sent them all
            return None
        due = [i for i, at in waiting.items() if at <= now]
        if due:
            started = time.monotonic()
            rows = self.claimer.claim_among(due, len(due))
            stats = (self.sender.send_rows(rows, deadline=send_deadline(started,
                                                                        self.claimer.lease))
                     if rows else SendStats())
            self.stats.send.add(stats)
            self.stats.resent += stats.sent
            if stats.outage:
                return stats.outage
            if stats.sent == len(due):  # all sent: what waits is what was not due yet
                waiting = {i: at for i, at in waiting.items() if at > now}
            else:
                waiting = self._open(ids)
        if not waiting:
            return None
        delay = max(MIN_RECHECK, (min(waiting.values()) - utcnow()).total_seconds())
        if not self.scheduler.schedule(sorted(waiting), delay):
            return "could not schedule the re-check"
        self.stats.rescheduled += 1
        return None

    def _open(self, ids: Sequence[int]) -> dict[int, dt.datetime]:
        """id -> when it is due, for the rows of `ids` still PENDING or SENDING (one query by
        primary key)."""
        t = self.table
        pending, sending = int(OutboxState.PENDING), int(OutboxState.SENDING)
        with self.engine.connect() as conn:
            rows: list[Any] = list(conn.execute(
                sa.select(t.c.id, t.c.state, t.c.next_retry_at, t.c.lease_until)
                .where(t.c.id.in_(list(ids)), t.c.state.in_([pending, sending]))))
        return {int(r.id): (r.next_retry_at if r.state == pending else r.lease_until)
                or utcnow() for r in rows}
