"""Sending claimed rows and recording each outcome with a compare-and-set UPDATE."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.clock import utcnow
from consumer_kit.errors import MessageTooLarge, TransportError, TransportUnavailable
from consumer_kit.schema import REASON_LEN, OutboxState
from consumer_kit.transports.base import Transport
from outbox_producer import metrics
from outbox_producer.backoff import Backoff
from outbox_producer.envelope import envelope
from outbox_producer.errors import BrokerUnavailable

log = logging.getLogger("consumer_kit.outbox.sender")

#: rows per UPDATE when marking a batch SENT
MARK_CHUNK = 500


@dataclasses.dataclass
class SendStats:
    """What one batch did."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    conflicts: int = 0

    def add(self, other: SendStats) -> None:
        """Accumulate another batch's counts."""
        self.sent += other.sent
        self.retried += other.retried
        self.failed += other.failed
        self.conflicts += other.conflicts


@dataclasses.dataclass
class Sender:
    """Sends rows already claimed (SENDING, lease held) and marks them."""

    engine: Engine
    table: sa.Table
    transport: Transport
    owner: str
    backoff: Backoff = dataclasses.field(default_factory=Backoff)
    #: FAILED rows get a slow retry after this long (None: FAILED waits for an operator)
    failed_retry_after: dt.timedelta | None = None

    def send_rows(
        self, rows: Sequence[dict[str, Any]], *, pace: Callable[[], object] | None = None
    ) -> SendStats:
        """Send each row; mark SENT, or schedule a retry, or FAILED after `max_retries`.

        `pace` runs before each send (the relay's rate cap). A send that raises
        `TransportUnavailable` makes its row a suspect: a later send in the batch that succeeds
        shows the broker is up, and the suspect is charged a retry like any failed send (a
        problem of that row: RocketMQ reports every send failure, a missing topic route too, as
        unavailable). A second `TransportUnavailable` before any success, or the batch's end,
        means an outage: the batch stops and its unsent rows go back to PENDING with their
        `retry_count` unchanged, so a long outage never pushes the backlog to FAILED.

        Raises:
            BrokerUnavailable: an outage stopped the batch (the rows sent before are marked;
                `stats` says what the batch did). The caller backs off.
        """
        sent: list[dict[str, Any]] = []
        failures: list[tuple[dict[str, Any], str, bool]] = []
        suspect: tuple[dict[str, Any], TransportUnavailable] | None = None
        outage: TransportUnavailable | None = None
        unsent: list[dict[str, Any]] = []
        for i, row in enumerate(rows):
            if pace is not None:
                pace()
            try:
                result = self.transport.send(envelope(row))
            except MessageTooLarge as exc:  # retrying cannot help
                failures.append((row, _reason(exc), True))
                continue
            except TransportUnavailable as exc:
                if suspect is None:  # the next send tells an outage from a problem of this row
                    suspect = (row, exc)
                    continue
                outage, unsent, suspect = exc, [suspect[0], *rows[i:]], None
                break
            except TransportError as exc:
                failures.append((row, _reason(exc), False))
                continue
            except Exception as exc:  # a transport bug must not kill the relay or lose the row
                log.exception("message %s: unexpected send error", row["message_id"])
                failures.append((row, _reason(exc), False))
                continue
            sent.append({"b_id": row["id"], "b_lv": row["lock_version"],
                         "b_bid": result.broker_message_id[:128]})
            log.debug("message %s sent as %s", row["message_id"], result.broker_message_id)
            if suspect is not None:  # the broker is up: the suspect's failure is its own
                failures.append((suspect[0], _reason(suspect[1]), False))
                suspect = None
        if suspect is not None:  # nothing after it proved the broker up
            outage, unsent = suspect[1], [suspect[0]]
        stats = SendStats()
        if sent:
            stats.sent, stats.conflicts = self._mark_sent(sent)
            metrics.SENT.inc(stats.sent)
        for row, reason, permanent in failures:
            self._mark_failure(row, reason, permanent, stats)
        if outage is not None:
            stats.conflicts += self._release(unsent)
            raise BrokerUnavailable(
                f"broker unavailable; {len(unsent)} unsent rows back to PENDING, no retry counted "
                f"(first message {unsent[0]['message_id']}): {outage}", stats) from outage
        return stats

    def _release(self, rows: Sequence[dict[str, Any]]) -> int:
        """Put claimed rows back to PENDING as they were before the claim (`retry_count`,
        `next_retry_at` and `fail_reason` untouched), guarded by the claim's `(id, lock_version)`
        and state SENDING; return how many had moved meanwhile (acked, or lease reclaimed)."""
        t = self.table
        now = utcnow()
        changed = 0
        with self.engine.begin() as conn:
            for start in range(0, len(rows), MARK_CHUNK):
                chunk = rows[start:start + MARK_CHUNK]
                changed += conn.execute(
                    sa.update(t)
                    .where(sa.tuple_(t.c.id, t.c.lock_version).in_(
                        [(r["id"], r["lock_version"]) for r in chunk]),
                        t.c.state == int(OutboxState.SENDING))
                    .values(state=int(OutboxState.PENDING), lease_owner=None, lease_until=None,
                            lock_version=t.c.lock_version + 1, gmt_modified=now,
                            updated_by=self.owner[:128])
                ).rowcount
        return len(rows) - changed

    def _mark_sent(self, params: list[dict[str, Any]]) -> tuple[int, int]:
        """Mark a batch SENT with one guarded UPDATE per chunk: the guard is the row's
        `(id, lock_version)` pair and state SENDING; the broker ids come in through a CASE."""
        t = self.table
        now = utcnow()
        changed = 0
        with self.engine.begin() as conn:
            for start in range(0, len(params), MARK_CHUNK):
                chunk = params[start:start + MARK_CHUNK]
                broker_id = sa.case({p["b_id"]: p["b_bid"] for p in chunk}, value=t.c.id)
                changed += conn.execute(
                    sa.update(t)
                    .where(sa.tuple_(t.c.id, t.c.lock_version).in_(
                        [(p["b_id"], p["b_lv"]) for p in chunk]),
                        t.c.state == int(OutboxState.SENDING))
                    .values(state=int(OutboxState.SENT), broker_message_id=broker_id,
                            sent_at=now, lease_owner=None, lease_until=None,
                            lock_version=t.c.lock_version + 1, gmt_modified=now,
                            updated_by=self.owner[:128], fail_reason=None)
                ).rowcount
        # a row not changed was acked before we marked it (it is CONSUMED already) or its
        # lease was reclaimed; both are fine, neither is overwritten
        return changed, len(params) - changed

    def _mark_failure(
        self, row: dict[str, Any], reason: str, permanent: bool, stats: SendStats
    ) -> None:
        t = self.table
        now = utcnow()
        retries = int(row["retry_count"]) + 1
        exhausted = permanent or retries > int(row["max_retries"])
        if exhausted:
            state = OutboxState.FAILED
            next_at = now + self.failed_retry_after if self.failed_retry_after else now
        else:
            state = OutboxState.PENDING
            next_at = now + self.backoff.delay(retries - 1)
        with self.engine.begin() as conn:
            changed = conn.execute(
                sa.update(t)
                .where(t.c.id == row["id"], t.c.lock_version == row["lock_version"],
                       t.c.state == int(OutboxState.SENDING))
                .values(state=int(state), retry_count=retries, next_retry_at=next_at,
                        fail_reason=reason[:REASON_LEN], lease_owner=None, lease_until=None,
                        lock_version=t.c.lock_version + 1, gmt_modified=now,
                        updated_by=self.owner[:128])
            ).rowcount
        if not changed:
            stats.conflicts += 1
            return
        if exhausted:
            stats.failed += 1
            metrics.FAILED.inc()
            log.warning("message %s FAILED after %d attempts: %s", row["message_id"], retries,
                        reason)
        else:
            stats.retried += 1
            metrics.RETRIED.inc()
            log.info("message %s send failed (attempt %d), retry at %s: %s",
                     row["message_id"], retries, next_at.isoformat(), reason)


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
