"""`--claim lock`: a relay sends the rows it holds locked and marks them in that transaction.

On the real servers only (SKIP LOCKED and an idle-transaction timeout); SQLite is refused.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError, TransportUnavailable
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import build_metadata
from consumer_kit.core.states import OutboxState
from outbox_producer import Backoff, Relay
from outbox_producer.claim import Claimer
from tests.cli import ckit, error_line
from tests.conftest import Db
from tests.producer.test_relay import FlakyTransport, publish_many, row
from tests.producer.test_relay_concurrency import bulk_insert, drain_side_by_side
from tests.recording import HeldTransport, RecordingTransport
from tests.test_state_machine import LOCKED_MOVES, Statements


@pytest.fixture
def statements(server_db: Db) -> Iterator[Statements]:
    watched = Statements(server_db.names.outbox)
    try:
        yield watched
    finally:
        watched.close()


def test_lock_mode_sends_every_due_row_once_with_one_update_per_row(
        server_db: Db, statements: Statements) -> None:
    # Given 25 due rows
    ids = publish_many(server_db, 25)
    transport = RecordingTransport()
    # When a relay in lock mode drains them
    result = Relay(server_db.engine, transport, table=server_db.names.outbox, batch=10,
                   claim="lock").run_once()
    # Then each went out once, is SENT with its broker id, and was written once (the lease
    # claim writes twice: lock_version 2)
    assert result.stats.sent == 25 and result.batches == 3
    assert transport.counts() == {mid: 1 for mid in ids}
    for mid in ids:
        r = row(server_db, mid)
        assert (r["state"], r["lock_version"]) == (int(OutboxState.SENT), 1)
        assert r["broker_message_id"] and r["sent_at"] is not None and r["lease_owner"] is None
        assert r["last_attempt_at"] is not None
    assert {name for _verb, name in statements.seen} == {"send_locked"} < LOCKED_MOVES
    assert len(statements.seen) == 3  # one UPDATE per batch


@pytest.mark.slow
def test_four_lock_relays_send_each_of_4000_rows_exactly_once(server_db: Db) -> None:
    bulk_insert(server_db, 4_000)
    transport = RecordingTransport()
    relays = [Relay(server_db.engine, transport, table=server_db.names.outbox, batch=100,
                    owner=f"relay-{i}", claim="lock") for i in range(4)]
    sent = drain_side_by_side(relays)
    counts = transport.counts()
    assert len(counts) == 4_000 and max(counts.values()) == 1
    assert sum(sent.values()) == 4_000
    assert all(n > 0 for n in sent.values()), sent  # they really ran side by side
    assert server_db.count(server_db.names.outbox, "state = 2") == 4_000


def test_rows_a_lock_relay_holds_are_skipped_by_every_other_relay(server_db: Db) -> None:
    # Given a lock relay stuck in the send of the first of 5 rows (its batch holds all 5)
    ids = publish_many(server_db, 5)
    held = HeldTransport(ids[0])
    first = Relay(server_db.engine, held, table=server_db.names.outbox, batch=5, claim="lock")
    worker = threading.Thread(target=first.step)
    worker.start()
    try:
        assert held.holding.wait(10)
        # When a lock relay and a lease relay run meanwhile
        others = RecordingTransport()
        for claim in ("lock", "lease"):
            Relay(server_db.engine, others, table=server_db.names.outbox, claim=claim).run_once()
        # Then neither took any held row
        assert others.sent == []
        assert {row(server_db, m)["state"] for m in ids} == {int(OutboxState.PENDING)}
    finally:
        held.release.set()
        worker.join(30)
    # And the first relay's batch is marked once it is done
    assert {row(server_db, m)["state"] for m in ids} == {int(OutboxState.SENT)}
    assert held.counts() == {mid: 1 for mid in ids}


def test_a_lock_relay_marks_its_batch_while_another_holds_rows_of_a_small_table(
        server_db: Db) -> None:
    # Given 6 due rows (a table so small that MariaDB would rather scan the outbox than join
    # the batch's ids to it) and a lock relay stuck in the send of the first of its 3
    ids = publish_many(server_db, 6)
    held = HeldTransport(ids[0])
    first = Relay(server_db.engine, held, table=server_db.names.outbox, batch=3, claim="lock")
    worker = threading.Thread(target=first.step)
    worker.start()
    try:
        assert held.holding.wait(10)
        # When another lock relay sends the other 3
        others = RecordingTransport()
        began = time.monotonic()
        second = Relay(server_db.engine, others, table=server_db.names.outbox, batch=3,
                       claim="lock")
        done = threading.Thread(target=second.step)
        done.start()
        done.join(10)
        # Then its mark touched its own rows only: it did not wait for the held ones
        assert not done.is_alive(), "the second relay's mark waited on the first one's rows"
        assert time.monotonic() - began < 10
        assert sorted(others.counts()) == sorted(ids[3:])
        assert {row(server_db, m)["state"] for m in ids[3:]} == {int(OutboxState.SENT)}
    finally:
        held.release.set()
        worker.join(30)
    assert {row(server_db, m)["state"] for m in ids} == {int(OutboxState.SENT)}
    assert {**held.counts(), **others.counts()} == {mid: 1 for mid in ids}


def test_a_batch_held_longer_than_the_lease_rolls_back_and_any_relay_sends_it_again(
        server_db: Db) -> None:
    # Given a lock relay with a 1 s lease whose send of the first row hangs for 3 s
    ids = publish_many(server_db, 3)
    held = HeldTransport(ids[0], seconds=3.0)
    stuck = Relay(server_db.engine, held, table=server_db.names.outbox, batch=3, claim="lock",
                  lease=dt.timedelta(seconds=1))
    # When its step ends (the server ended the idle transaction meanwhile)
    with pytest.raises(sa.exc.DBAPIError):
        stuck.step()
    # Then nothing was marked: the rows are as before the batch, no retry counted
    for mid in ids:
        r = row(server_db, mid)
        assert (r["state"], r["retry_count"], r["lock_version"]) == (
            int(OutboxState.PENDING), 0, 0)
    # and any relay sends them (again: at least once, the consumers dedupe)
    again = RecordingTransport()
    assert Relay(server_db.engine, again, table=server_db.names.outbox,
                 claim="lock").run_once().stats.sent == 3
    assert again.counts() == {mid: 1 for mid in ids}
    assert {row(server_db, m)["state"] for m in ids} == {int(OutboxState.SENT)}


def test_a_failed_send_in_lock_mode_is_retried_after_the_back_off(server_db: Db) -> None:
    # Given a row and a transport that refuses it once
    [mid] = publish_many(server_db, 1)
    transport = FlakyTransport()
    transport.fail_next = 1
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock",
                  backoff=Backoff(schedule=(60,), jitter=0.0))
    # When the relay tries it
    relay.step()
    # Then it is PENDING with a retry counted, a reason, and due after the back-off
    r = row(server_db, mid)
    assert (r["state"], r["retry_count"]) == (int(OutboxState.PENDING), 1)
    assert "broker down" in str(r["fail_reason"])
    assert r["next_retry_at"] > utcnow() + dt.timedelta(seconds=50)  # type: ignore[operator]
    assert relay.step() is None and transport.sent == []  # not due yet


def test_a_send_that_fails_unavailable_just_before_half_the_lease_is_reported_as_an_outage(
        server_db: Db) -> None:
    # Given a lock relay (1 s lease: sends stop at 0.5 s) whose first send fails as
    # "unavailable" after 0.7 s, so that no later send can tell an outage from its own fault
    ids = publish_many(server_db, 3)

    class SlowThenDown(RecordingTransport):
        def send(self, message: OutgoingMessage) -> SendResult:
            time.sleep(0.7)
            raise TransportUnavailable("no route to the broker (simulated)")

    relay = Relay(server_db.engine, SlowThenDown(), table=server_db.names.outbox, batch=3,
                  claim="lock", lease=dt.timedelta(seconds=1))
    # When a batch runs
    stats = relay.step()
    # Then the failure is reported (an outage: back off), not dropped, and nothing was charged
    assert stats is not None and stats.outage is not None
    assert "no route to the broker" in stats.outage
    for mid in ids:
        r = row(server_db, mid)
        assert (r["state"], r["retry_count"], r["lock_version"]) == (
            int(OutboxState.PENDING), 0, 0)


def test_a_lock_relay_fails_a_row_whose_retries_are_exhausted(
        server_db: Db, statements: Statements) -> None:
    [mid] = publish_many(server_db, 1, max_retries=1)
    transport = FlakyTransport()
    transport.fail_next = 10
    Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock",
          backoff=Backoff(schedule=(0,), jitter=0.0)).run_once()
    r = row(server_db, mid)
    assert (r["state"], r["retry_count"]) == (int(OutboxState.FAILED), 2)
    assert [name for _verb, name in statements.seen] == ["retry_locked", "give_up_locked"]
    assert transport.attempts == 2 and transport.sent == []


def test_a_broker_outage_in_lock_mode_leaves_the_rows_untouched(server_db: Db) -> None:
    # Given three due rows and a broker that cannot be reached
    ids = publish_many(server_db, 3)
    transport = FlakyTransport(TransportUnavailable("broker down (simulated)"))
    transport.fail_next = 1_000
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock")
    # When the relay tries a batch
    stats = relay.step()
    # Then it stopped after the second failure in a row and wrote nothing to the rows
    assert stats is not None and "3 unsent rows left as they were" in str(stats.outage)
    assert stats.released == 3 and stats.sent == stats.retried == 0
    for mid in ids:
        r = row(server_db, mid)
        assert (r["state"], r["retry_count"], r["lock_version"]) == (
            int(OutboxState.PENDING), 0, 0)


def test_a_lock_relay_takes_over_an_expired_lease_of_a_dead_sender(server_db: Db) -> None:
    [mid] = publish_many(server_db, 1)
    table = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox).table
    assert len(Claimer(server_db.engine, table, "dead-dispatcher",
                       lease=dt.timedelta(seconds=-1)).claim(10)) == 1
    transport = RecordingTransport()
    Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock").run_once()
    assert transport.counts() == {mid: 1}
    r = row(server_db, mid)
    assert (r["state"], r["lease_owner"], r["lease_until"]) == (int(OutboxState.SENT), None, None)


class SlowTransport(RecordingTransport):
    """Each send takes `seconds` (a broker that answers slowly)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def send(self, message: OutgoingMessage) -> SendResult:
        time.sleep(self.seconds)
        return super().send(message)


def test_a_slow_broker_makes_short_batches_not_transactions_past_the_lease(
        server_db: Db) -> None:
    # Given 10 due rows, sends of 0.3 s and a 2 s lease: the whole batch would take 3 s
    ids = publish_many(server_db, 10)
    transport = SlowTransport(0.3)
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, batch=10,
                  claim="lock", lease=dt.timedelta(seconds=2))
    # When one batch runs
    stats = relay.step()
    # Then it stopped sending at half the lease and marked what it sent; the rest is untouched
    assert stats is not None and stats.outage is None
    assert 2 <= stats.sent <= 5, stats
    states = [row(server_db, m) for m in ids]
    assert sum(r["state"] == int(OutboxState.SENT) for r in states) == stats.sent
    untouched = [r for r in states if r["state"] == int(OutboxState.PENDING)]
    assert len(untouched) == 10 - stats.sent
    assert all((r["retry_count"], r["lock_version"]) == (0, 0) for r in untouched)
    # and the next batches send the rest, each row once
    relay.run_once()
    assert transport.counts() == {mid: 1 for mid in ids}


@pytest.mark.mariadb
def test_the_mariadb_session_gets_its_idle_transaction_timeout_back(mariadb: Db) -> None:
    # Given a one-connection pool whose session has a timeout of its own
    engine = make_engine(mariadb.url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET SESSION idle_transaction_timeout = 123, "
                                 "SESSION idle_readonly_transaction_timeout = 124, "
                                 "SESSION idle_write_transaction_timeout = 125")
            conn.commit()
        publish_many(mariadb, 2)
        relay = Relay(engine, RecordingTransport(), table=mariadb.names.outbox, claim="lock",
                      lease=dt.timedelta(seconds=7))
        # When a batch ran on it
        assert relay.step() is not None
        # Then the session has its own timeouts again, not the lease
        with engine.connect() as conn:
            assert tuple(conn.exec_driver_sql(
                "SELECT @@SESSION.idle_transaction_timeout, "
                "@@SESSION.idle_readonly_transaction_timeout, "
                "@@SESSION.idle_write_transaction_timeout").one()) == (123, 124, 125)
    finally:
        engine.dispose()


@pytest.mark.mariadb
def test_a_short_read_only_idle_timeout_of_the_session_does_not_cut_a_held_batch_short(
        mariadb: Db) -> None:
    # Given sessions whose DBA set a 1 s idle timeout for read-only transactions (MariaDB
    # applies it before idle_transaction_timeout) and a lock relay with a 10 s lease whose
    # first send takes 2.5 s
    engine = make_engine(mariadb.url, connect_args={
        "init_command": "SET SESSION idle_readonly_transaction_timeout = 1"})
    try:
        ids = publish_many(mariadb, 2)
        held = HeldTransport(ids[0], seconds=2.5)
        relay = Relay(engine, held, table=mariadb.names.outbox, claim="lock",
                      lease=dt.timedelta(seconds=10))
        # When it runs a batch
        stats = relay.step()
        # Then the lease, not the session's own timeout, bounded it: both rows sent once, SENT
        assert stats is not None and stats.sent == 2
        assert held.counts() == {mid: 1 for mid in ids}
        assert {row(mariadb, m)["state"] for m in ids} == {int(OutboxState.SENT)}
    finally:
        engine.dispose()


def test_lock_mode_is_refused_with_one_line_where_it_cannot_hold_its_promise(
        sqlite_db: Db, server_db: Db) -> None:
    with pytest.raises(ConfigError, match=r"SKIP LOCKED.*use --claim lease"):
        Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox,
              claim="lock")
    with pytest.raises(ConfigError, match="no --read-url"):
        Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
              claim="lock", read_engine=server_db.engine)
    with pytest.raises(ConfigError, match="unknown claim mode 'locks'"):
        Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
              claim="locks")
    with pytest.raises(ConfigError, match=r"--max-rate 0\.1 with --lease 30s"):
        Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
              claim="lock", max_rate=0.1)
    with pytest.raises(ConfigError, match="--lease of at least 1s"):
        Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
              claim="lock", lease=dt.timedelta(milliseconds=500))


def sql_transport(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'mq.db'}"
    build_metadata().create_all(make_engine(url))
    return f"sql+{url}"


def test_ckit_relay_claim_lock_on_sqlite_fails_before_any_row_moves(
        sqlite_db: Db, tmp_path: Path) -> None:
    ids = publish_many(sqlite_db, 2)
    result = ckit("relay", "--url", sqlite_db.url, "--transport", sql_transport(tmp_path),
                  "--once", "--outbox-table", sqlite_db.names.outbox, "--claim", "lock")
    assert result.returncode == 2
    assert "--claim lock needs SELECT ... FOR UPDATE SKIP LOCKED" in error_line(result.stderr)
    assert {row(sqlite_db, m)["state"] for m in ids} == {int(OutboxState.PENDING)}


def test_ckit_relay_claim_lock_drains_a_server_database(server_db: Db, tmp_path: Path) -> None:
    ids = publish_many(server_db, 4)
    result = ckit("relay", "--url", server_db.url, "--transport", sql_transport(tmp_path),
                  "--once", "--outbox-table", server_db.names.outbox, "--claim", "lock",
                  "--json")
    assert result.returncode == 0, result.stderr
    assert '"sent": 4' in result.stdout
    assert {row(server_db, m)["state"] for m in ids} == {int(OutboxState.SENT)}
