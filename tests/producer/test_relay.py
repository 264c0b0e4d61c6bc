"""The relay: batches, back-off, FAILED, leases, shards, delays, rate cap, outages."""

from __future__ import annotations

import datetime as dt
import threading
import time

import sqlalchemy as sa

from consumer_kit.clock import utcnow
from consumer_kit.schema import OutboxState, outbox_table
from outbox_producer import Backoff, Outbox, Relay, Shard
from outbox_producer.claim import Claimer
from tests.conftest import Db
from tests.recording import RecordingTransport

FAST = Backoff(schedule=(0.0,), jitter=0.0)


def publish_many(db: Db, n: int, **kwargs: object) -> list[str]:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, **kwargs)  # type: ignore[arg-type]
    with db.engine.begin() as conn:
        return [outbox.publish(conn, "T", {"i": i}, biz_type="t", biz_key=str(i))
                for i in range(n)]


def row(db: Db, mid: str) -> dict[str, object]:
    table = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        return dict(conn.execute(sa.select(table).where(table.c.message_id == mid))
                    .mappings().one())


def test_run_once_sends_every_due_row_once_and_marks_it_sent(db: Db) -> None:
    ids = publish_many(db, 25)
    transport = RecordingTransport()
    result = Relay(db.engine, transport, table=db.names.outbox, batch=10).run_once()
    assert result.stats.sent == 25 and result.batches == 3
    assert transport.counts() == {mid: 1 for mid in ids}
    assert {row(db, m)["state"] for m in ids} == {int(OutboxState.SENT)}
    assert all(row(db, m)["broker_message_id"] for m in ids)


def test_the_envelope_carries_id_biz_source_and_commit_time(db: Db) -> None:
    [mid] = publish_many(db, 1)
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    sent = transport.sent[0]
    assert sent.keys[0] == mid
    assert sent.properties["ckit_id"] == mid
    assert sent.properties["ckit_biz"] == "t:0"
    assert sent.properties["ckit_src"] == "orders"
    assert abs(int(sent.properties["ckit_sent"]) - time.time() * 1000) < 60_000


def test_a_failed_send_is_retried_later_with_back_off_and_a_reason(db: Db) -> None:
    [mid] = publish_many(db, 1)
    transport = RecordingTransport()
    transport.fail_next = 1
    relay = Relay(db.engine, transport, table=db.names.outbox,
                  backoff=Backoff(schedule=(60,), jitter=0.0))
    relay.run_once()
    r = row(db, mid)
    assert r["state"] == int(OutboxState.PENDING)
    assert r["retry_count"] == 1
    assert "broker down" in str(r["fail_reason"])
    assert r["next_retry_at"] > utcnow() + dt.timedelta(seconds=50)  # type: ignore[operator]
    assert transport.sent == []


def test_after_max_retries_the_row_is_failed(db: Db) -> None:
    [mid] = publish_many(db, 1, max_retries=2)
    transport = RecordingTransport()
    transport.fail_next = 10
    relay = Relay(db.engine, transport, table=db.names.outbox, backoff=FAST)
    relay.run_once()
    r = row(db, mid)
    assert r["state"] == int(OutboxState.FAILED)
    assert r["retry_count"] == 3
    assert "broker down" in str(r["fail_reason"])


def test_failed_rows_get_a_slow_retry_when_configured(db: Db) -> None:
    [mid] = publish_many(db, 1, max_retries=0)
    transport = RecordingTransport()
    transport.fail_next = 1
    Relay(db.engine, transport, table=db.names.outbox, backoff=FAST).run_once()
    assert row(db, mid)["state"] == int(OutboxState.FAILED)
    # a relay without slow retry leaves it alone
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert row(db, mid)["state"] == int(OutboxState.FAILED)
    # one with slow retry sends it once its time has come
    Relay(db.engine, transport, table=db.names.outbox,
          failed_retry_after=dt.timedelta(seconds=1)).run_once()
    assert row(db, mid)["state"] == int(OutboxState.SENT)


def test_a_delayed_message_is_not_sent_before_its_time(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        mid = outbox.publish(conn, "T", {}, biz_type="t", biz_key="1", delay=dt.timedelta(hours=1))
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert transport.sent == []
    assert row(db, mid)["state"] == int(OutboxState.PENDING)


def test_a_sending_row_whose_lease_expired_is_reclaimed_and_sent(db: Db) -> None:
    [mid] = publish_many(db, 1)
    crashed = Claimer(db.engine, Relay(db.engine, RecordingTransport(),
                                       table=db.names.outbox).table, "crashed-relay",
                      lease=dt.timedelta(seconds=-1))
    assert len(crashed.claim(10)) == 1  # claimed, then the relay "dies" before sending
    assert row(db, mid)["state"] == int(OutboxState.SENDING)
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert transport.counts() == {mid: 1}
    assert row(db, mid)["state"] == int(OutboxState.SENT)


def test_a_live_lease_is_not_taken_by_another_relay(db: Db) -> None:
    publish_many(db, 1)
    table = Relay(db.engine, RecordingTransport(), table=db.names.outbox).table
    Claimer(db.engine, table, "other", lease=dt.timedelta(minutes=5)).claim(10)
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert transport.sent == []


def test_shards_split_the_rows_between_relays(db: Db) -> None:
    ids = publish_many(db, 20)
    first, second = RecordingTransport(), RecordingTransport()
    Relay(db.engine, first, table=db.names.outbox, shard=Shard(0, 2)).run_once()
    Relay(db.engine, second, table=db.names.outbox, shard=Shard(1, 2)).run_once()
    assert len(first.sent) == len(second.sent) == 10
    assert set(first.counts()) | set(second.counts()) == set(ids)


def test_max_rate_caps_the_sends_per_second(sqlite_db: Db) -> None:
    publish_many(sqlite_db, 10)
    transport = RecordingTransport()
    started = time.monotonic()
    Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox, max_rate=20).run_once()
    assert len(transport.sent) == 10
    assert time.monotonic() - started >= 0.4


def test_the_relay_survives_a_database_outage_and_keeps_trying(tmp_path: object) -> None:
    relay = Relay("mysql+pymysql://app:SECRET@127.0.0.1:1/none", RecordingTransport())
    relay.claimer.skip_locked = False
    worker = threading.Thread(target=lambda: setattr(relay, "result", relay.run()))
    worker.start()
    time.sleep(1.2)
    relay.stop()
    worker.join(10)
    assert not worker.is_alive()
    assert relay.result.errors >= 2  # type: ignore[attr-defined]


def test_stop_finishes_the_current_batch_and_returns(db: Db) -> None:
    publish_many(db, 5)
    relay = Relay(db.engine, RecordingTransport(), table=db.names.outbox, idle_sleep=0.05)
    worker = threading.Thread(target=relay.run)
    worker.start()
    time.sleep(0.5)
    relay.stop()
    worker.join(10)
    assert not worker.is_alive()
    with db.engine.connect() as conn:
        assert conn.execute(sa.text(
            f"SELECT COUNT(*) FROM {db.names.outbox} WHERE state = 2")).scalar() == 5


def test_the_relay_publishes_the_backlog_and_the_oldest_unacked_age(db: Db) -> None:
    from outbox_producer import metrics

    publish_many(db, 3, max_retries=10)
    Relay(db.engine, RecordingTransport(), table=db.names.outbox, batch=2).run(max_batches=1)
    metrics.refresh_backlog(db.engine, outbox_table(sa.MetaData(), db.names.outbox))
    assert metrics.BACKLOG.labels("SENT")._value.get() == 2
    assert metrics.BACKLOG.labels("PENDING")._value.get() == 1
    assert metrics.OLDEST_UNACKED._value.get() >= 0
