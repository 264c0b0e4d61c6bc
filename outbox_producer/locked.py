"""`--claim lock`: send due rows while holding their row locks, and mark them in that transaction.

The lease claim (the default) writes every row twice: PENDING -> SENDING under a lease in one
transaction, SENT in another, with the sends between them outside any transaction. On a table
whose `state` is indexed neither UPDATE is a HOT/in-place one, so every index of the outbox gets
two new entries per message. Here one transaction does it all:

    BEGIN
      bound the transaction's idle time by the lease (see below)
      SELECT ... WHERE due ORDER BY next_retry_at LIMIT :batch FOR UPDATE SKIP LOCKED
      send each row
      UPDATE ... SET state = SENT ... (one `cas_each`: `send_locked`), failures `retry_locked` /
      `give_up_locked`
    COMMIT

The guarantees are the lease's, held by the database instead of by a column:

- **No double send**: other relays skip the locked rows (SKIP LOCKED), the dispatcher's
  compare-and-set waits for the commit and then finds the row moved.
- **The lease**: the transaction's idle time (the time between two statements: the sends) is
  bounded by the server, `idle_in_transaction_session_timeout` (PostgreSQL, `SET LOCAL`) or
  `idle_transaction_timeout` (MariaDB, set for the session and put back after the commit). A
  relay that hangs or dies loses its session, the rows roll back to what they were (PENDING,
  no retry counted) and are due at once for any relay: the same at-least-once re-send an
  expired lease gives, which the consumers dedupe.
- **Back-off and FAILED**: a failed send is charged in the same transaction, as the lease
  claim charges it.
- **Outages**: rows left unsent by a broker outage are not written at all (they stay PENDING,
  their retry count unchanged).

Needs SKIP LOCKED and a server-side idle-transaction timeout: PostgreSQL or MariaDB >= 10.6,
and not a Galera node: its row locks stop relays on the same node only, and a relay on another
node would send the same rows before the certification failed one of the commits.
Expired leases of other senders (a dispatcher that died) are taken over as well. The rows are
never seen in SENDING: `ckit outbox stats` counts them PENDING until their commit.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from consumer_kit.core import checkin
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import dialect_name, is_galera_node, supports_skip_locked
from consumer_kit.core.errors import CkitError, ConfigError
from consumer_kit.core.rows import OutboxRow
from outbox_producer import metrics
from outbox_producer.claim import Claimer, send_deadline
from outbox_producer.send_stats import SendStats, carry_committed
from outbox_producer.sender import Sender, count_failures

log = logging.getLogger(__name__)

#: The claim modes of a relay.
CLAIM_MODES = ("lease", "lock")

#: MariaDB's idle-transaction timeouts: a read-only or a writing transaction takes its own one
#: when that is set (> 0), else the general one; the held batch is bounded by all three
_MARIADB_TIMEOUTS = ("idle_transaction_timeout", "idle_readonly_transaction_timeout",
                     "idle_write_transaction_timeout")
_MARIADB_SET = "SET " + ", ".join(
    [f"@ckit_{v} = @@SESSION.{v}" for v in _MARIADB_TIMEOUTS]
    + [f"SESSION {v} = {{seconds}}" for v in _MARIADB_TIMEOUTS])
_MARIADB_RESTORE = "SET " + ", ".join(f"SESSION {v} = @ckit_{v}" for v in _MARIADB_TIMEOUTS)


def check_lock_mode(engine: sa.engine.Engine) -> None:
    """Raise `ConfigError` (one line) unless this database can hold a batch locked with a
    server-side bound on the transaction's idle time."""
    name = dialect_name(engine)
    if not supports_skip_locked(engine):
        raise ConfigError(
            f"--claim lock needs SELECT ... FOR UPDATE SKIP LOCKED (PostgreSQL or MariaDB >= "
            f"10.6); this {engine.dialect.name} database has not: use --claim lease")
    if name == "mysql" and not getattr(engine.dialect, "is_mariadb", False):
        raise ConfigError(
            "--claim lock bounds a held batch with the server's idle-transaction timeout, "
            "which MySQL lacks (MariaDB and PostgreSQL have one): use --claim lease")
    if is_galera_node(engine):
        raise ConfigError(
            "--claim lock holds its rows by row locks, which a Galera node keeps to itself: a "
            "relay on another node would send the same rows; use --claim lease (its claims "
            "are certified across the cluster)")


@dataclasses.dataclass
class LockedSender:
    """One relay loop's batches in `--claim lock` mode (see the module's docstring)."""

    claimer: Claimer
    sender: Sender
    lease: dt.timedelta

    def __post_init__(self) -> None:
        engine = self.sender.engine
        check_lock_mode(engine)  # (connects once on MySQL/MariaDB to learn the version)
        self._postgres = dialect_name(engine) == "postgresql"
        seconds = self.lease.total_seconds()
        if seconds < 1:
            raise ConfigError(f"--claim lock needs a --lease of at least 1s, not {self.lease}")
        # PostgreSQL takes milliseconds; MariaDB whole seconds (rounded up, never shorter)
        self._timeout = (f"'{int(seconds * 1000)}ms'" if self._postgres
                         else str(math.ceil(seconds)))

    def step(self, batch: int, *, pace: Callable[[], object] | None = None) -> SendStats | None:
        """Pick, send and mark up to `batch` due rows in one transaction; None when none was
        due. Sends stop at half the lease after the pick: rows not sent by then stay as they
        were (due again at once), so a slow broker makes small batches, not killed sessions.

        Raises:
            ConfigError, SchemaError: the transport is misconfigured; what was sent before it
                is marked, the rest stays as it was.
            DBAPIError: the database failed or ended the transaction (a batch that outlasted
                the lease): nothing of the batch is marked, its rows are due again.
        """
        began = time.monotonic()
        with checkin.connection(self.sender.engine) as conn:
            try:
                stats, fatal = self._step(conn, batch, pace)
            except DBAPIError:
                conn.invalidate()
                held = time.monotonic() - began
                if held >= self.lease.total_seconds():
                    log.warning("a --claim lock batch was held %.1fs, past --lease %s: the "
                                "database ended its transaction, its rows are due again "
                                "(those sent go out twice; consumers dedupe)", held, self.lease)
                raise
            except BaseException:
                conn.invalidate()  # never pool a session whose timeout was changed
                raise
            if stats is not None and not self._postgres:
                try:
                    conn.exec_driver_sql(_MARIADB_RESTORE)
                    conn.commit()
                except Exception as exc:  # the batch's marks are committed all the same
                    conn.invalidate()
                    carry_committed(exc, stats)
                    raise
        if fatal is not None:
            if stats is not None:
                carry_committed(fatal, stats)
            raise fatal
        return stats

    def _step(self, conn: Connection, batch: int, pace: Callable[[], object] | None
              ) -> tuple[SendStats | None, CkitError | None]:
        sent: list[int] = []  # sends the broker accepted, unmarked until the commit
        try:
            return self._step_in(conn, batch, pace, sent)
        except Exception as exc:  # the marks rolled back: those rows go out again
            if sent and sent[0]:
                carry_committed(exc, SendStats(unmarked=sent[0]))
            raise

    def _step_in(self, conn: Connection, batch: int, pace: Callable[[], object] | None,
                 sent: list[int]) -> tuple[SendStats | None, CkitError | None]:
        with conn.begin():
            rows = self._pick(conn, batch)
            if not rows:
                return None, None
            picked_at = utcnow()
            if self._postgres:  # the lease bounds this transaction's idle time (the sends)
                conn.exec_driver_sql(
                    f"SET LOCAL idle_in_transaction_session_timeout = {self._timeout}")
            else:  # (the session's own values are put back after the commit)
                conn.exec_driver_sql(_MARIADB_SET.format(seconds=self._timeout))
            deadline = send_deadline(time.monotonic(), self.lease)
            attempt = self.sender.attempt(rows, pace=pace, deadline=deadline)
            sent.append(len(attempt.sent))
            stats = SendStats()
            done = {"last_attempt_at": picked_at}
            if attempt.sent:
                stats.sent, stats.conflicts = self.sender.mark_sent(
                    conn, attempt.sent, "send_locked", values=done)
            for row, reason, permanent in attempt.failures:
                self.sender.mark_failure(conn, row, reason, permanent, stats,
                                         moves=("retry_locked", "give_up_locked"),
                                         values=done)
        metrics.SENT.inc(stats.sent)
        count_failures(stats, SendStats())
        if attempt.outage is not None and attempt.fatal is None:
            stats.released = len(attempt.unsent)
            stats.outage = attempt.outage_text(stats.released, "left as they were")
        elif attempt.unsent and attempt.fatal is None and attempt.stopped:
            log.info("--claim lock: %d rows of the batch left PENDING, not sent: the relay is "
                     "stopping and they were to wait for their turn under the rate cap",
                     len(attempt.unsent))
        elif attempt.unsent and attempt.fatal is None:
            log.info("--claim lock: %d rows of the batch not sent within half the lease (%s); "
                     "due again at once", len(attempt.unsent), self.lease)
        return stats, attempt.fatal

    def _pick(self, conn: Connection, batch: int) -> list[OutboxRow]:
        """Lock up to `batch` due rows (then expired leases of other senders), oldest due
        first, skipping rows another transaction holds."""
        c = self.claimer
        t = c.table
        now = utcnow()
        columns = c.columns
        rows = conn.execute(
            sa.select(*columns).where(*c.due(now)).order_by(t.c.next_retry_at)
            .limit(batch).with_for_update(skip_locked=True)).all()
        if len(rows) < batch:
            rows = [*rows, *conn.execute(
                sa.select(*columns).where(*c.expired(now)).limit(batch - len(rows))
                .with_for_update(skip_locked=True)).all()]
        return [OutboxRow.from_row(r) for r in rows]
