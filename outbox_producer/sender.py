"""Sending claimed rows and recording each outcome through the outbox state machine."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core import checkin
from consumer_kit.core.clock import utcnow
from consumer_kit.core.envelope import to_message
from consumer_kit.core.errors import (
    CkitError,
    ConfigError,
    MessageRefused,
    SchemaError,
    TransportClosed,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.schema import MESSAGE_ID_LEN, REASON_LEN
from consumer_kit.core.states import OutboxState
from consumer_kit.core.transitions import Versions, cas, cas_each
from consumer_kit.transports.base import Transport
from outbox_producer import metrics
from outbox_producer.backoff import Backoff
from outbox_producer.send_stats import SendStats, carry_committed

log = logging.getLogger(__name__)

#: rows per UPDATE when marking a batch SENT
MARK_CHUNK = 5000
#: `TransportUnavailable` failures of one topic after which a batch tries no more of its rows
SUSPECT_AFTER = 2
#: `TransportUnavailable` from this many topics with no success after them is an outage
OUTAGE_TOPICS = 3


@dataclasses.dataclass
class Attempt:
    """The sorted outcomes of sending a batch, before anything is written: `sent` (row, broker
    id), `failures` (row, reason, permanent), and when the batch stopped early, the rows left
    `unsent` with the `outage` or the `fatal` configuration error that stopped it."""

    sent: list[tuple[OutboxRow, str]] = dataclasses.field(default_factory=list)
    failures: list[tuple[OutboxRow, str, bool]] = dataclasses.field(default_factory=list)
    unsent: list[OutboxRow] = dataclasses.field(default_factory=list)
    outage: TransportUnavailable | None = None
    fatal: CkitError | None = None
    #: the pace said stop (the relay is stopping): `unsent` holds the rows not tried
    stopped: bool = False

    def outage_text(self, released: int, where: str | None = None) -> str:
        """The `SendStats.outage` line for this batch's outage (`where`: where the unsent rows
        went; by default back to the state they were claimed from)."""
        if where is None:
            failed = sum(r.claimed_from == OutboxState.FAILED for r in self.unsent)
            where = ("back to PENDING" if not failed else "back to FAILED"
                     if failed == len(self.unsent) else "back to PENDING or FAILED as they were")
        return (f"broker unavailable; {released} unsent rows {where}, no retry counted "
                f"(first message {self.unsent[0].message_id}): {self.outage}")


@dataclasses.dataclass
class Sender:
    """Sends rows already claimed (SENDING, send lease held) and marks them."""

    engine: Engine
    table: sa.Table
    transport: Transport
    owner: str
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    #: FAILED rows get a slow retry after this long (None: FAILED waits for an operator)
    failed_retry_after: dt.timedelta | None = None

    def send_rows(
        self, rows: Sequence[OutboxRow], *, pace: Callable[[], object] | None = None,
        deadline: float | None = None,
    ) -> SendStats:
        """Send each row; mark SENT, or schedule a retry, or FAILED after `max_retries`.

        `pace` runs before each send (the relay's rate cap); when it returns False (the
        relay is stopping) no more sends start, and the rows not tried are released as past
        the deadline, never sent in a burst. `deadline` (a `time.monotonic()`
        value: `claim.send_deadline` of the claim's start and lease) is when sends stop: rows
        not sent by then are released, as they were before the claim with no retry counted
        (`released`; logged at info), so a batch of slow sends never outlives its lease and
        is never sent a second time by a relay that reclaimed it.

        `TransportUnavailable` is either an outage or a problem of the row's topic (RocketMQ
        reports every send failure, a missing topic route too, as unavailable), so failures of
        one topic never stop the rows of others:

        - a send that raises it makes its row a suspect; after `SUSPECT_AFTER` (2) such
          failures of one topic with no success of it in between, the batch tries no more rows
          of that topic and goes on with the others;
        - a later send that succeeds shows the broker is up: each suspect is charged a retry
          like any failed send, and so is each row of a topic set aside (its topic failed while
          the broker was up; charged rather than released, so it does not lead the next batch
          again and reaches `max_retries`, then FAILED, as a row tried each time would);
        - so does a success on another topic earlier in the batch, at its end (or its
          `deadline`);
        - rows of three topics failing with no success after them, or the batch's end (or its
          `deadline`) with a suspect nothing proved wrong (a batch of one topic whose rows
          fail, or whose other topics failed too), mean an outage: the batch stops, its
          unsent rows (suspects and rows set aside too) go back to PENDING (to FAILED when the
          slow retry took them from there) with their `retry_count` unchanged (so a long
          outage never pushes the backlog to FAILED), and `outage` says why. The caller backs
          off.

        >>> started = time.monotonic()                                   # doctest: +SKIP
        >>> rows = claimer.claim(100)                                    # doctest: +SKIP
        >>> sender.send_rows(rows, deadline=send_deadline(started, claimer.lease))  # doctest: +SKIP

        Raises:
            ConfigError, SchemaError, TransportClosed: the transport is misconfigured (e.g.
                its tables are missing) or closed: the rows not sent yet went back as they
                were, no retry counted.
            sqlalchemy.exc.DBAPIError: a mark or a release failed.
            Either carries the marks the batch had committed before it (`committed_part`).
        """
        attempt = self.attempt(rows, pace=pace, deadline=deadline)
        stats = SendStats()
        # `stats` as of the last commit: what an error leaves done (the sends too, until
        # their marks commit)
        committed = SendStats(unmarked=len(attempt.sent))
        try:
            if attempt.sent:
                with checkin.begin(self.engine) as conn:
                    stats.sent, stats.conflicts = self.mark_sent(conn, attempt.sent,
                                                                 "mark_sent")
                metrics.SENT.inc(stats.sent)
                committed = dataclasses.replace(stats)
            for row, reason, permanent in attempt.failures:
                with checkin.begin(self.engine) as conn:
                    self.mark_failure(conn, row, reason, permanent, stats,
                                      moves=("retry_later", "give_up"))
                count_failures(stats, committed)
                committed = dataclasses.replace(stats)
            if attempt.fatal is not None:
                self._release(attempt.unsent)
                raise attempt.fatal
        except Exception as exc:
            carry_committed(exc, committed)
            raise
        if attempt.unsent:  # an outage, or the deadline
            released = self._release(attempt.unsent)
            stats.released = released
            stats.conflicts += len(attempt.unsent) - released
            if attempt.outage is not None:
                stats.outage = attempt.outage_text(released)
            elif attempt.stopped:
                log.info("%d rows of the batch released, not sent: the relay is stopping and "
                         "they were to wait for their turn under the rate cap (first message "
                         "%s)", released, attempt.unsent[0].message_id)
            elif not attempt.sent and not attempt.failures:
                # not one send started: the claim itself took half the lease. Claiming again at
                # once would do the same, so the caller backs off as from an outage
                stats.outage = (f"no send started within half the send lease: {released} "
                                "claimed rows released, no retry counted (the claim took that "
                                "long: a slow database, or raise --lease)")
            else:
                log.info("%d rows of the batch not sent within half the send lease: released, "
                         "due again at once (first message %s)", released,
                         attempt.unsent[0].message_id)
        return stats

    def attempt(
        self, rows: Sequence[OutboxRow], *, pace: Callable[[], object] | None = None,
        deadline: float | None = None,
    ) -> Attempt:
        """Send each row and sort the outcomes (see `send_rows` for the rule on
        `TransportUnavailable`); write nothing. With `deadline` (a `time.monotonic()` value) no
        send starts after it: the rest is `unsent` (with neither `outage` nor `fatal` unless a
        suspect was left unproven)."""
        out = Attempt()
        doubt = _Doubt()
        for i, row in enumerate(rows):
            if doubt.failures.get(row.topic, 0) >= SUSPECT_AFTER:  # its topic failed enough
                doubt.aside.append(row)
                continue
            if row.defect is not None:  # e.g. a hand-edited headers column: no send can help
                # (and it sends nothing, so it takes no turn under a rate cap)
                out.failures.append((row, f"not sent: {row.defect}", True))
                continue
            if pace is not None and pace() is False:  # stopping: the rest waits its turn
                doubt.stop(out, rows[i:])
                out.stopped = True
                break
            if deadline is not None and time.monotonic() >= deadline:
                doubt.stop(out, rows[i:])
                break
            try:
                result = self.transport.send(to_message(row))
            except (ConfigError, SchemaError, TransportClosed) as exc:  # no row is to blame:
                # stop, charge none
                out.fatal, out.unsent = exc, [*doubt.undecided(), *rows[i:]]
                break
            except MessageRefused as exc:  # retrying cannot help (too large, empty)
                out.failures.append((row, _reason(exc), True))
                continue
            except TransportUnavailable as exc:
                if doubt.failed(row, exc):  # rows of three topics failed, none went through
                    out.outage, out.unsent = exc, [*doubt.undecided(), *rows[i + 1:]]
                    break
                continue
            except TransportError as exc:
                out.failures.append((row, _reason(exc), False))
                continue
            except Exception as exc:  # a transport bug must not kill the relay or lose the row
                log.exception("message %s: unexpected send error", row.message_id)
                out.failures.append((row, _reason(exc), False))
                continue
            out.sent.append((row, result.broker_message_id[:MESSAGE_ID_LEN]))
            log.debug("message %s sent as %s", row.message_id, result.broker_message_id)
            doubt.sent(row, out)  # the broker is up: the suspects' failures are their own
        else:
            doubt.stop(out, [])
        return out

    def _release(self, rows: Sequence[OutboxRow]) -> int:
        """Put claimed rows back as they were before the claim: to FAILED when the slow retry
        took them from there (`release_failed`), else to PENDING (`release`; a row reclaimed
        from an expired lease too), with `retry_count`, `next_retry_at` and `fail_reason`
        untouched; return how many were still ours."""
        now = utcnow()
        failed = [(r.id, r.lock_version) for r in rows
                  if r.claimed_from == OutboxState.FAILED]
        others = [(r.id, r.lock_version) for r in rows
                  if r.claimed_from != OutboxState.FAILED]
        free = {"lease_owner": None, "lease_until": None}
        released = 0
        with checkin.begin(self.engine) as conn:
            for move, pairs in (("release", others), ("release_failed", failed)):
                if pairs:
                    released += cas(conn, self.table, move, Versions(pairs), now=now,
                                    by=self.owner, values=free)
        return released

    def mark_sent(self, conn: sa.Connection, sent: list[tuple[OutboxRow, str]],
                  move: str, values: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """Mark a batch SENT (transition `move`) with one guarded UPDATE per chunk, each row at
        its own `(id, lock_version)` with its own broker id (`cas_each`); return (changed,
        conflicts)."""
        now = utcnow()
        changed = 0
        for start in range(0, len(sent), MARK_CHUNK):
            chunk = sent[start:start + MARK_CHUNK]
            changed += cas_each(
                conn, self.table, move, [(r.id, r.lock_version, b) for r, b in chunk],
                column="broker_message_id", now=now, by=self.owner,
                values={"sent_at": now, "lease_owner": None, "lease_until": None,
                        "fail_reason": None, **(values or {})})
        # a row not changed got its receipt before we marked it (it is CONSUMED already) or its
        # lease was reclaimed; both are fine, neither is overwritten
        return changed, len(sent) - changed

    def mark_failure(self, conn: sa.Connection, row: OutboxRow, reason: str, permanent: bool,
                     stats: SendStats, *, moves: tuple[str, str],
                     values: Mapping[str, Any] | None = None) -> None:
        """Charge `row` a failed attempt: transition `moves[0]` (retry after the back-off) or,
        retries exhausted or `permanent`, `moves[1]` (FAILED)."""
        now = utcnow()
        retries = row.retry_count + 1
        exhausted = permanent or retries > row.max_retries
        if exhausted:
            move = moves[1]
            next_at = now + self.failed_retry_after if self.failed_retry_after else now
        else:
            move = moves[0]
            next_at = now + self.backoff.delay(retries - 1)
        changed = cas(conn, self.table, move, Versions([(row.id, row.lock_version)]),
                      now=now, by=self.owner,
                      values={"retry_count": retries, "next_retry_at": next_at,
                              "fail_reason": reason[:REASON_LEN], "lease_owner": None,
                              "lease_until": None, **(values or {})})
        if not changed:
            stats.conflicts += 1
            return
        if exhausted:  # (counted in the metrics by the caller, once committed)
            stats.failed += 1
            log.warning("message %s FAILED after %d attempts: %s", row.message_id, retries,
                        reason)
        else:
            stats.retried += 1
            log.info("message %s send failed (attempt %d), retry at %s: %s",
                     row.message_id, retries, next_at.isoformat(), reason)


def count_failures(stats: SendStats, before: SendStats) -> None:
    """Count in the metrics the retries and failures `stats` holds beyond `before`, once
    their marks committed (a rolled-back mark is charged nothing, and sent again)."""
    metrics.FAILED.inc(stats.failed - before.failed)
    metrics.RETRIED.inc(stats.retried - before.retried)


@dataclasses.dataclass
class _Doubt:
    """What `Sender.attempt` does not know yet about the `TransportUnavailable` failures of a
    batch: an outage, or rows (a topic without a route) the broker cannot take? See
    `Sender.send_rows` for the rule."""

    #: rows that failed with `TransportUnavailable` since the last success, with the error
    suspects: list[tuple[OutboxRow, TransportUnavailable]] = dataclasses.field(
        default_factory=list)
    #: `TransportUnavailable` failures per topic since that topic's last success in the batch
    failures: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the last such failure per topic
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    #: rows not tried: their topic failed `SUSPECT_AFTER` times in this batch
    aside: list[OutboxRow] = dataclasses.field(default_factory=list)
    #: the topics of the rows sent in this batch
    sent_topics: set[str] = dataclasses.field(default_factory=set)

    def failed(self, row: OutboxRow, exc: TransportUnavailable) -> bool:
        """Record `row`'s failure; True when it makes an outage: the unproven suspects, this
        row with them, are of `OUTAGE_TOPICS` topics (the row joins the suspects either way,
        first to be released). Two are not enough: two topics without a route at the head of
        every batch would stop the others for good, never charged."""
        self.suspects.append((row, exc))
        outage = len({r.topic for r, _ in self.suspects}) >= OUTAGE_TOPICS
        self.failures[row.topic] = self.failures.get(row.topic, 0) + 1
        self.reasons[row.topic] = _reason(exc)
        return outage

    def sent(self, row: OutboxRow, out: Attempt) -> None:
        """`row` went through: the broker is up (`disproved`), and its topic takes rows again
        (a failure before this success is not one of two in a row)."""
        self.sent_topics.add(row.topic)
        if self.failures:  # (else nothing failed since the last success: nothing to settle)
            self.failures.pop(row.topic, None)
            self.disproved(out)

    def disproved(self, out: Attempt) -> None:
        """A send went through: the broker is up, so each suspect's failure is its own (or its
        topic's) and is charged a retry, and so is each row set aside: its topic failed
        twice while the broker was up (charged, not released: released, it would lead the
        next batch again, and the next, and never reach `max_retries`)."""
        for row, exc in self.suspects:
            out.failures.append((row, _reason(exc), False))
        for row in self.aside:
            out.failures.append((row, f"not sent: {SUSPECT_AFTER} sends to topic {row.topic} "
                                      f"failed in this batch: {self.reasons[row.topic]}", False))
        self.suspects.clear()
        self.aside.clear()

    def undecided(self) -> list[OutboxRow]:
        """The rows whose outcome is still open (suspects, then rows set aside)."""
        return [*(r for r, _ in self.suspects), *self.aside]

    def stop(self, out: Attempt, rest: Sequence[OutboxRow]) -> None:
        """The batch ends (its last row, or the deadline) with `rest` not tried. Suspects no
        success followed make it an outage when they are of two topics (an outage that began
        after the batch's last success: released, they lead the next batch, where a success
        after them charges them) or when no row of another topic went through in the batch.
        Suspects of one topic after a success of another are charged, like what was set aside
        (the broker was up; were they released, a topic without a route at the end of every
        batch would never reach FAILED)."""
        topics = {r.topic for r, _ in self.suspects}
        if self.suspects and (len(topics) > 1 or not self.sent_topics - topics):
            out.outage = self.suspects[0][1]
            out.unsent = [*self.undecided(), *rest]
        else:
            self.disproved(out)
            out.unsent = list(rest)


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
