"""Scan a read replica, claim on the primary (seed 001: "read/write splitting, scan the replica").

`ReplicaClaimer` finds candidate rows with the relay's due query on a read replica, then claims
them on the primary with the same claim as every relay (`Claimer.claim` narrowed to the
candidates' ids: `CandidateClaimer.claim_among`): the primary re-checks that each row is still
due in the claim's own compare-and-set (SKIP LOCKED or the optimistic token claim), so a
candidate read from a stale replica (already sent, claimed by another relay, moved by an
operator) is simply not claimed. Replica lag can delay a row but never send it twice or lose it:

- a row the replica does not show yet (lag, a stopped replica) is found by a **primary sweep**:
  every `sweep_every` seconds one claim runs on the primary as if there were no replica, and
  sweeps go on back to back while they come back full (a backlog the replica hides is drained
  at full speed), then scans return to the replica;
- a replica that cannot be reached makes each step fall back to the primary (logged once per
  `sweep_every`), so an outage of the replica costs the primary its scans, not the messages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from consumer_kit.core.clock import utcnow
from consumer_kit.core.rows import OutboxRow
from outbox_producer.candidates import CandidateClaimer
from outbox_producer.claim import Claimer

log = logging.getLogger(__name__)

#: How often a replica-scanning relay claims on the primary regardless of what the replica shows.
DEFAULT_SWEEP_EVERY = 60.0


@dataclasses.dataclass
class ScanStats:
    """Where a replica-scanning claimer found its rows (for tests, logs and the bench)."""

    replica_scans: int = 0
    candidates: int = 0
    claimed: int = 0
    stale: int = 0
    sweeps: int = 0
    fallbacks: int = 0


@dataclasses.dataclass
class ReplicaClaimer(CandidateClaimer):
    """A `Claimer` that scans `read_engine` (a replica) and claims on `engine` (the primary).

    >>> claimer = ReplicaClaimer(primary, table, owner, read_engine=replica)   # doctest: +SKIP
    """

    read_engine: Engine | None = None
    sweep_every: float = DEFAULT_SWEEP_EVERY

    def __post_init__(self) -> None:
        super().__post_init__()
        self.stats = ScanStats()
        self._lock = threading.Lock()
        self._next_sweep = time.monotonic() + self.sweep_every
        self._sweeping = False
        self._next_warning = 0.0

    def claim(self, batch: int) -> list[OutboxRow]:
        """Claim up to `batch` rows: candidates from the replica re-checked and claimed on the
        primary, or a primary sweep when one is due (see the module doc)."""
        if self.read_engine is None or self._sweep_now():
            return self._sweep(batch)
        now = utcnow()
        try:
            ids = self._scan(batch, now)
        except DBAPIError as exc:
            self._warn_fallback(exc)
            with self._lock:
                self.stats.fallbacks += 1
            return Claimer.claim(self, batch)
        if not ids:
            return []
        rows = self.claim_among(ids, batch)
        with self._lock:
            self.stats.replica_scans += 1
            self.stats.candidates += len(ids)
            self.stats.claimed += len(rows)
            self.stats.stale += len(ids) - len(rows)
        return rows

    def sweep_next(self) -> bool:
        """Make the next claim a primary sweep (`--once` ends with one: the replica may not
        show rows due on the primary yet); False without a replica."""
        if self.read_engine is None:
            return False
        with self._lock:
            self._next_sweep = 0.0
        return True

    def _sweep_now(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._sweeping or now >= self._next_sweep:
                self._next_sweep = now + self.sweep_every
                return True
            return False

    def _sweep(self, batch: int) -> list[OutboxRow]:
        try:
            rows = Claimer.claim(self, batch)
        except Exception:
            with self._lock:  # not swept: the next claim sweeps (a lost claim, an outage)
                self._next_sweep = 0.0
            raise
        with self._lock:
            self.stats.sweeps += 1
            # a full sweep means the primary holds more than the replica showed: sweep again
            self._sweeping = self.read_engine is not None and len(rows) >= batch
        return rows

    def _scan(self, batch: int, now: dt.datetime) -> list[int]:
        """Ids of due rows, then of expired send leases, as the replica shows them."""
        assert self.read_engine is not None
        t = self.table
        with self.read_engine.connect() as conn:
            ids = list(conn.execute(sa.select(t.c.id).where(*self.due(now))
                                    .order_by(t.c.next_retry_at).limit(batch)).scalars())
            if len(ids) < batch:
                ids += conn.execute(sa.select(t.c.id).where(*self.expired(now))
                                    .limit(batch - len(ids))).scalars()
        return [int(i) for i in ids]

    def _warn_fallback(self, exc: DBAPIError) -> None:
        now = time.monotonic()
        if now < self._next_warning:
            return
        self._next_warning = now + self.sweep_every
        reason = str(exc.orig).splitlines()[0] if exc.orig else str(exc)
        log.warning("relay %s: read replica unavailable, scanning the primary instead: %s",
                    self.owner, reason)
