"""Several relays side by side never send a row twice (the normal case)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import outbox_table
from outbox_producer import Outbox, Relay
from outbox_producer.ids import new_message_id
from tests.conftest import Db
from tests.recording import RecordingTransport

ROWS = 10_000


def bulk_insert(db: Db, n: int) -> None:
    table = outbox_table(sa.MetaData(), db.names.outbox)
    now = utcnow()
    rows = [{"message_id": new_message_id(), "biz_type": "t", "biz_key": str(i), "topic": "T",
             "body": b'{"i":%d}' % i, "state": 0, "retry_count": 0, "max_retries": 10,
             "next_retry_at": now, "lock_version": 0, "created_by": "orders",
             "gmt_create": now, "gmt_modified": now} for i in range(n)]
    with db.engine.begin() as conn:
        for start in range(0, n, 2000):
            conn.execute(sa.insert(table), rows[start:start + 2000])


def drain_side_by_side(relays: list[Relay], timeout: float = 240) -> dict[int, int]:
    """Run each relay's `run_once` on a thread of its own; return the rows each sent."""
    sent: dict[int, int] = {}
    threads = [threading.Thread(target=lambda i=i: sent.__setitem__(
        i, relays[i].run_once().stats.sent)) for i in range(len(relays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return sent


@pytest.mark.slow
def test_four_relays_on_a_database_server_send_each_of_10000_rows_exactly_once(
    server_db: Db,
) -> None:
    # Given
    bulk_insert(server_db, ROWS)
    transport = RecordingTransport()
    relays = [Relay(server_db.engine, transport, table=server_db.names.outbox, batch=200,
                    owner=f"relay-{i}") for i in range(4)]
    # When
    results = drain_side_by_side(relays)
    # Then
    counts = transport.counts()
    assert len(counts) == ROWS
    assert max(counts.values()) == 1
    assert sum(results.values()) == ROWS
    assert all(n > 0 for n in results.values()), results  # they really ran side by side
    assert server_db.count(server_db.names.outbox, "state = 2") == ROWS


def test_four_relays_on_sqlite_send_each_row_exactly_once(sqlite_db: Db) -> None:
    bulk_insert(sqlite_db, 2_000)
    transport = RecordingTransport()
    relays = [Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox, batch=100,
                    owner=f"relay-{i}") for i in range(4)]
    threads = [threading.Thread(target=r.run_once) for r in relays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    counts = transport.counts()
    assert len(counts) == 2_000 and max(counts.values()) == 1


def test_one_relay_with_three_workers_sends_each_row_exactly_once(db: Db) -> None:
    bulk_insert(db, 3_000)
    transport = RecordingTransport()
    result = Relay(db.engine, transport, table=db.names.outbox, batch=100, workers=3).run_once()
    counts = transport.counts()
    assert result.stats.sent == 3_000
    assert len(counts) == 3_000 and max(counts.values()) == 1


def test_a_running_relay_never_deadlocks_the_business_transactions_that_publish(
    server_db: Db,
) -> None:
    # Given: a relay claiming continuously (locking reads on the due-rows index)
    transport = RecordingTransport()
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, batch=50,
                  idle_sleep=0.001)
    worker = threading.Thread(target=relay.run)
    worker.start()
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    try:
        # When: services publish in multi-row transactions at the same time
        ids = []
        for start in range(0, 1500, 30):
            with server_db.engine.begin() as conn:
                ids += [outbox.publish(conn, "T", {"n": n}, biz_type="t", biz_key=str(n))
                        for n in range(start, start + 30)]
        deadline = time.monotonic() + 60
        while len(transport.counts()) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay.stop()
        worker.join(30)
    # Then: no publish failed (a deadlock would have raised above) and all were sent once
    counts = transport.counts()
    assert set(counts) == set(ids) and max(counts.values()) == 1


@pytest.mark.mariadb
def test_a_relay_built_from_a_url_claims_with_skip_locked_on_mariadb(mariadb: Db) -> None:
    # Given a relay on an engine that has not connected yet (the server's version unknown)
    relay = Relay(mariadb.url, RecordingTransport(), table=mariadb.names.outbox)
    try:
        # Then its claims still use SKIP LOCKED (MariaDB 10.11), not the optimistic token
        assert relay.claimer.skip_locked is True
    finally:
        relay.engine.dispose()


class Misconfigured(RecordingTransport):
    def send(self, message: OutgoingMessage) -> SendResult:
        raise ConfigError("topic T does not exist (simulated)")


def test_an_error_in_one_of_several_workers_ends_the_run_and_reaches_the_caller(
        sqlite_db: Db) -> None:
    bulk_insert(sqlite_db, 50)
    relay = Relay(sqlite_db.engine, Misconfigured(), table=sqlite_db.names.outbox, batch=5,
                  workers=3)
    with pytest.raises(ConfigError, match="topic T does not exist"):
        relay.run_once()
    assert sqlite_db.count(sqlite_db.names.outbox, "state = 0") == 50  # none charged
