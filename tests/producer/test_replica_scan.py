"""The replica-scanning claimer on SQLite files: a second file plays a (stale) replica.

Unit tests of the rules; tests/integration/test_replica.py proves them on a real MariaDB replica.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import build_metadata, outbox_table
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox, Relay
from outbox_producer.replica import ReplicaClaimer
from tests.conftest import Db
from tests.recording import RecordingTransport


@pytest.fixture
def replica(sqlite_db: Db, tmp_path: Path) -> Iterator[sa.Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'replica.db'}")
    build_metadata(sqlite_db.names, include_transport=False).create_all(engine)
    yield engine
    engine.dispose()


def publish(db: Db, keys: range) -> list[str]:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        return [outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=str(k)) for k in keys]


def copy_to(db: Db, replica: sa.Engine) -> None:
    """The replica catches up: it shows the primary's outbox as it is now."""
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.select(t)).mappings()]
    with replica.begin() as conn:
        conn.execute(sa.delete(t).execution_options(ckit_transition="test-setup"))
        if rows:
            conn.execute(sa.insert(t), rows)


def relay(db: Db, transport: RecordingTransport, replica: sa.Engine | str,
          **options: object) -> Relay:
    return Relay(db.engine, transport, table=db.names.outbox, read_engine=replica,
                 **options)  # type: ignore[arg-type]


def scans(r: Relay) -> ReplicaClaimer:
    assert isinstance(r.claimer, ReplicaClaimer)
    return r.claimer


def test_rows_the_replica_does_not_show_yet_are_not_claimed_by_a_scan(
        sqlite_db: Db, replica: sa.Engine) -> None:
    # Given 10 rows of which the replica shows the first 5
    shown = publish(sqlite_db, range(5))
    copy_to(sqlite_db, replica)
    hidden = publish(sqlite_db, range(5, 10))
    transport = RecordingTransport()
    # When a relay scanning the replica claims a batch
    result = relay(sqlite_db, transport, replica, sweep_every=3600).run(max_batches=1)
    # Then it sent exactly the rows the replica showed
    assert result.stats.sent == 5 and transport.counts() == {m: 1 for m in shown}
    assert not set(transport.counts()) & set(hidden)


def test_once_ends_with_a_primary_sweep_so_rows_a_stalled_replica_hides_are_sent(
        sqlite_db: Db, replica: sa.Engine) -> None:
    # Given 10 rows of which a replica that stopped applying shows the first 5, and no sweep
    # due for an hour
    ids = publish(sqlite_db, range(5))
    copy_to(sqlite_db, replica)
    ids += publish(sqlite_db, range(5, 10))
    transport = RecordingTransport()
    worker = relay(sqlite_db, transport, replica, sweep_every=3600)
    # When `ckit relay --once` drains what is due
    worker.run_once()
    # Then the replica's rows and, by the sweep it ends with, the primary's went out once each
    assert transport.counts() == {m: 1 for m in ids}
    assert scans(worker).stats.sweeps == 1


def test_candidates_already_sent_on_the_primary_are_not_sent_again(
        sqlite_db: Db, replica: sa.Engine) -> None:
    # Given a replica that shows 10 PENDING rows, 6 of which the primary already sent
    ids = publish(sqlite_db, range(10))
    copy_to(sqlite_db, replica)
    transport = RecordingTransport()
    Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox, batch=6).run(max_batches=1)
    # When a relay scanning the stale replica runs
    worker = relay(sqlite_db, transport, replica, sweep_every=3600)
    worker.run_once()
    # Then the stale candidates were re-checked on the primary: every row went out once (the
    # second scan found the same 10 candidates, all sent by then, and ended the run)
    assert transport.counts() == {m: 1 for m in ids}
    stats = scans(worker).stats
    assert (stats.replica_scans, stats.candidates, stats.claimed) == (2, 20, 4)


def test_a_due_primary_sweep_drains_what_the_replica_hides_batch_after_batch(
        sqlite_db: Db, replica: sa.Engine) -> None:
    # Given 50 rows the (empty) replica does not show, and a sweep that came due
    ids = publish(sqlite_db, range(50))
    transport = RecordingTransport()
    worker = relay(sqlite_db, transport, replica, batch=10, sweep_every=0.05)
    time.sleep(0.06)
    # When the relay drains what is due
    worker.run_once()
    # Then full sweeps went on back to back until one came back short (and --once ended with
    # one more, which found nothing)
    assert transport.counts() == {m: 1 for m in ids}
    assert scans(worker).stats.sweeps == 7 and scans(worker).stats.replica_scans == 0


def test_an_unreachable_replica_makes_the_relay_scan_the_primary(
        sqlite_db: Db, tmp_path: Path) -> None:
    # Given a read replica that cannot be reached (nothing listens on its port)
    ids = publish(sqlite_db, range(12))
    transport = RecordingTransport()
    worker = relay(sqlite_db, transport, "mysql+pymysql://ckit:pw@127.0.0.1:1/ckit", batch=5)
    # When the relay runs
    worker.run_once()
    # Then every row still went out once, claimed from the primary's own scan
    assert transport.counts() == {m: 1 for m in ids}
    assert scans(worker).stats.fallbacks == 4


def test_the_backlog_gauges_are_read_from_the_replica(
        sqlite_db: Db, replica: sa.Engine) -> None:
    from outbox_producer import metrics

    # Given a replica showing 3 PENDING rows while the primary has 7
    publish(sqlite_db, range(3))
    copy_to(sqlite_db, replica)
    publish(sqlite_db, range(3, 7))
    # When the relay refreshes its gauges
    relay(sqlite_db, RecordingTransport(), replica, sweep_every=3600)._refresh_metrics()
    # Then they count what the replica shows
    assert metrics.BACKLOG.labels(metrics.database_label(sqlite_db.engine),
                                  OutboxState.PENDING.name)._value.get() == 3


def test_a_primary_sweep_that_fails_is_made_again_so_once_still_sends_what_the_replica_hides(
        sqlite_db: Db, replica: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 5 rows a stalled replica does not show, and a primary sweep whose first claim
    # fails with an outage (or loses to another relay's claim: either way nothing claimed)
    import sqlite3

    from outbox_producer import relay as relay_module
    from outbox_producer.claim import Claimer

    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.01, 0.02))
    ids = publish(sqlite_db, range(5))
    failures = [1]
    claim = Claimer.claim

    def fail_once(self: Claimer, batch: int) -> list:  # type: ignore[type-arg]
        if failures[0]:
            failures[0] -= 1
            raise sa.exc.OperationalError("UPDATE", {}, sqlite3.OperationalError(
                "database is locked"))
        return claim(self, batch)

    monkeypatch.setattr(Claimer, "claim", fail_once)
    transport = RecordingTransport()
    # When `--once` ends with its primary sweep, then the failed sweep is made again and
    # sends them (it was counted as made: the run ended with the rows still due)
    result = relay(sqlite_db, transport, replica, sweep_every=3600).run_once()
    assert failures == [0] and result.errors == 1
    assert transport.counts() == {m: 1 for m in ids}
