"""The relay: batches, back-off, FAILED, leases, shards, delays, rate cap, outages."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import (
    EmptyBody,
    MessageTooLarge,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from outbox_producer import Backoff, Outbox, Relay, Shard
from outbox_producer.claim import Claimer
from outbox_producer.relay import RateLimiter
from tests.conftest import Db
from tests.recording import HeldTransport, RecordingTransport, SlowTransport

FAST = Backoff(schedule=(0.0,), jitter=0.0)


class FlakyTransport(RecordingTransport):
    """Fails its next `fail_next` sends with `error`: by default a send error of the row (retried
    with back-off), not the broker being unreachable. `attempts` counts every send."""

    def __init__(self, error: Exception | None = None,
                 fails: Callable[[OutgoingMessage], bool] | None = None) -> None:
        super().__init__()
        self.error = error or TransportError("broker down (simulated)")
        self.fails = fails
        self.attempts = 0

    def send(self, message: OutgoingMessage) -> SendResult:
        with self.lock:
            self.attempts += 1
            if self.fails is not None and self.fails(message):
                raise self.error
            if self.fail_next:
                self.fail_next -= 1
                raise self.error
        return super().send(message)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


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
    transport = FlakyTransport()
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
    transport = FlakyTransport()
    transport.fail_next = 10
    relay = Relay(db.engine, transport, table=db.names.outbox, backoff=FAST)
    relay.run_once()
    r = row(db, mid)
    assert r["state"] == int(OutboxState.FAILED)
    assert r["retry_count"] == 3
    assert "broker down" in str(r["fail_reason"])


def test_failed_rows_get_a_slow_retry_when_configured(db: Db) -> None:
    [mid] = publish_many(db, 1, max_retries=0)
    transport = FlakyTransport()
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


def test_rows_an_outage_left_unsent_go_back_to_the_state_they_were_claimed_from(db: Db) -> None:
    # Given a FAILED row due for its slow retry ...
    failed, expired = publish_many(db, 2, max_retries=0)
    table = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:  # (the second row waits while the first one fails)
        conn.execute(sa.update(table).where(table.c.message_id == expired)
                     .values(next_retry_at=utcnow() + dt.timedelta(hours=1)))
    refused = FlakyTransport()
    refused.fail_next = 1
    Relay(db.engine, refused, table=db.names.outbox, backoff=FAST).run_once()
    before = row(db, failed)
    assert (before["state"], before["retry_count"]) == (int(OutboxState.FAILED), 1)
    # ... and a row whose send lease expired (its sender died)
    with db.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.message_id == expired)
                     .values(next_retry_at=utcnow()))
    assert len(Claimer(db.engine, table, "crashed-relay",
                       lease=dt.timedelta(seconds=-1)).claim(10)) == 1
    # When a relay with the slow retry claims both and the broker is down
    down = FlakyTransport(TransportUnavailable("broker down (simulated)"))
    down.fail_next = 1_000
    relay = Relay(db.engine, down, table=db.names.outbox,
                  failed_retry_after=dt.timedelta(hours=6))
    stats = relay.step()
    # Then the FAILED row is FAILED again as it was (its retry count, due time and reason) ...
    assert stats is not None and stats.released == 2 and stats.outage is not None
    after = row(db, failed)
    for column in ("state", "retry_count", "next_retry_at", "fail_reason"):
        assert after[column] == before[column], column
    assert (after["lease_owner"], after["lease_until"]) == (None, None)
    # ... the expired lease's row is PENDING, with no retry charged to either
    r = row(db, expired)
    assert (r["state"], r["retry_count"], r["lease_owner"]) == (int(OutboxState.PENDING), 0,
                                                                None)
    # and a relay without the slow retry sends only the PENDING one
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert transport.counts() == {expired: 1}


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


def test_a_lease_mode_batch_starts_no_send_after_half_its_lease_and_releases_the_rest(
        db: Db) -> None:
    # Given ten due rows, a send lease of 1 s and a broker that takes 0.2 s per send
    ids = publish_many(db, 10)
    slow = SlowTransport(0.2)
    relay = Relay(db.engine, slow, table=db.names.outbox, batch=10,
                  lease=dt.timedelta(seconds=1))
    # When the relay sends one batch
    began = time.monotonic()
    stats = relay.step()
    # Then no send started after half the lease (another relay may reclaim the rows once it
    # ran out): what went out is SENT, the rest is PENDING again with no retry charged
    assert stats is not None and stats.outage is None
    assert stats.released >= 1 and stats.sent + stats.released == 10
    assert max(slow.started) - began < 0.5
    released = [m for m in ids if row(db, m)["state"] == int(OutboxState.PENDING)]
    assert len(released) == stats.released
    for mid in released:
        r = row(db, mid)
        assert (r["retry_count"], r["lease_owner"], r["fail_reason"]) == (0, None, None)
    # And the next batches send the rest, each row once
    fast = RecordingTransport()
    Relay(db.engine, fast, table=db.names.outbox).run_once()
    assert sorted([*slow.counts(), *fast.counts()]) == sorted(ids)
    assert {row(db, m)["state"] for m in ids} == {int(OutboxState.SENT)}


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


def test_the_relay_survives_a_database_outage_and_keeps_trying(
        caplog: pytest.LogCaptureFixture) -> None:
    relay = Relay("mysql+pymysql://app:SECRET@127.0.0.1:1/none", RecordingTransport())
    relay.claimer.skip_locked = False
    worker = threading.Thread(target=lambda: setattr(relay, "result", relay.run()),
                              daemon=True)

    def retries() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if relay.owner in r.getMessage() and "retry in" in r.getMessage()]

    try:
        with caplog.at_level("WARNING", logger="outbox_producer"):
            worker.start()
            deadline = time.monotonic() + 30
            while len(retries()) < 2 and worker.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        relay.stop()
    worker.join(10)
    assert not worker.is_alive()
    assert relay.result.errors >= 2  # type: ignore[attr-defined]
    # its waits between attempts start at half a second and double
    assert [m.rsplit("retry in ", 1)[1] for m in retries()[:2]] == ["0.5s", "1.0s"]


def test_stop_finishes_the_current_batch_and_returns(db: Db) -> None:
    ids = publish_many(db, 5)
    transport = HeldTransport(ids[0])
    relay = Relay(db.engine, transport, table=db.names.outbox, idle_sleep=0.05)
    worker = threading.Thread(target=relay.run, daemon=True)
    worker.start()
    try:
        # stopped while a send of the batch is under way
        assert transport.holding.wait(30), "the relay never sent"
    finally:
        relay.stop()
        transport.release.set()
    worker.join(10)
    assert not worker.is_alive()
    with db.engine.connect() as conn:
        assert conn.execute(sa.text(
            f"SELECT COUNT(*) FROM {db.names.outbox} WHERE state = 2")).scalar() == 5


def test_the_relay_publishes_the_backlog_and_the_oldest_unacked_age(db: Db) -> None:
    from outbox_producer import metrics

    publish_many(db, 3, max_retries=10)
    Relay(db.engine, RecordingTransport(), table=db.names.outbox, batch=2).run(max_batches=1)
    database = metrics.database_label(db.engine)
    assert metrics.BACKLOG.labels(database, "SENT")._value.get() == 2
    assert metrics.BACKLOG.labels(database, "PENDING")._value.get() == 1
    assert metrics.OLDEST_UNACKED.labels(database)._value.get() >= 0


def test_the_backlog_gauges_are_refreshed_once_per_relay_not_per_worker(
    sqlite_db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a relay with four worker loops
    from outbox_producer import metrics

    calls: list[str] = []
    monkeypatch.setattr(metrics, "refresh_backlog",
                        lambda engine, table, database: calls.append(table.name))
    publish_many(sqlite_db, 5)
    relay = Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox, batch=1,
                  workers=4)
    # When it drains the outbox
    relay.run_once()
    # Then the gauges were read when it started and when it returned, not once per loop
    assert calls == [sqlite_db.names.outbox] * 2


@pytest.mark.parametrize("refusal", [
    MessageTooLarge("body of 5000000 bytes exceeds the limit"),
    EmptyBody("the body is empty; RocketMQ refuses empty bodies"),
], ids=["too-large", "empty"])
def test_a_message_the_transport_refuses_fails_after_one_attempt(
        db: Db, refusal: Exception) -> None:
    # Given a row the transport refuses as it is (max_retries is 10)
    [mid] = publish_many(db, 1)
    transport = FlakyTransport(refusal)
    transport.fail_next = 1
    # When
    Relay(db.engine, transport, table=db.names.outbox, backoff=FAST).run_once()
    # Then retrying cannot help: FAILED at once, with the reason
    r = row(db, mid)
    assert transport.attempts == 1
    assert (r["state"], r["retry_count"]) == (int(OutboxState.FAILED), 1)
    assert f"{type(refusal).__name__}: {refusal}" in str(r["fail_reason"])


def test_a_broker_outage_stops_the_batch_and_costs_no_retry(db: Db) -> None:
    # Given three due rows and a broker that cannot be reached
    ids = publish_many(db, 3)
    transport = FlakyTransport(TransportUnavailable("broker down (simulated)"))
    transport.fail_next = 1_000
    relay = Relay(db.engine, transport, table=db.names.outbox)
    # When the relay tries a batch
    stats = relay.step()
    # Then it stopped after the second failure in a row and put every row back as it was
    assert stats is not None and "3 unsent rows back to PENDING" in str(stats.outage)
    assert transport.attempts == 2 and transport.sent == []
    assert stats.sent == stats.retried == 0 and stats.released == 3
    for mid in ids:
        r = row(db, mid)
        assert (r["state"], r["retry_count"], r["lease_owner"]) == (int(OutboxState.PENDING), 0,
                                                                    None)
        assert r["fail_reason"] is None and r["next_retry_at"] <= utcnow()  # type: ignore[operator]


def test_the_relay_waits_out_a_broker_outage_and_sends_when_it_is_back(db: Db) -> None:
    # Given a running relay and a broker that is down
    ids = publish_many(db, 3, max_retries=1)
    transport = FlakyTransport(TransportUnavailable("broker down (simulated)"))
    transport.fail_next = 1_000_000
    relay = Relay(db.engine, transport, table=db.names.outbox, idle_sleep=0.05)
    results = []
    worker = threading.Thread(target=lambda: results.append(relay.run()))
    worker.start()
    try:
        # When the outage lasts a while
        assert wait_for(lambda: transport.attempts >= 4)
        started, attempts = time.monotonic(), transport.attempts
        time.sleep(1.5)
        # Then the relay backs off (a few tries, not a busy loop) and no row is charged a retry
        tries = (transport.attempts - attempts) / 2
        assert tries <= max(2, (time.monotonic() - started) / 0.5)
        assert {row(db, m)["retry_count"] for m in ids} == {0}
        # And once the broker is back, every row is sent
        with transport.lock:
            transport.fail_next = 0
        assert wait_for(lambda: {row(db, m)["state"] for m in ids} == {int(OutboxState.SENT)},
                        timeout=60)
    finally:
        relay.stop()
        worker.join(30)
    assert not worker.is_alive()
    assert transport.counts() == {mid: 1 for mid in ids}
    assert results[0].errors >= 2 and results[0].stats.sent == 3


def test_a_row_whose_send_fails_while_later_sends_succeed_is_retried_not_an_outage(db: Db) -> None:
    # Given three claimed rows; the transport reports the broker unavailable for the first only
    # (RocketMQ reports a missing topic route that way)
    ids = publish_many(db, 3)
    poison = ids[0]
    transport = FlakyTransport(TransportUnavailable("No route info of this topic"),
                               fails=lambda m: m.properties["ckit_id"] == poison)
    relay = Relay(db.engine, transport, table=db.names.outbox,
                  backoff=Backoff(schedule=(60,), jitter=0.0))
    rows = sorted(relay.claimer.claim(10), key=lambda r: r.message_id != poison)
    # When
    stats = relay.sender.send_rows(rows)
    # Then the others went through and the failing row is charged a retry, like any failed send
    assert (stats.sent, stats.retried) == (2, 1)
    r = row(db, poison)
    assert (r["state"], r["retry_count"]) == (int(OutboxState.PENDING), 1)
    assert "No route info" in str(r["fail_reason"])
    assert {row(db, m)["state"] for m in ids[1:]} == {int(OutboxState.SENT)}


def test_rows_of_a_topic_without_a_route_cannot_stop_the_rows_of_other_topics(db: Db) -> None:
    # Given three rows of a topic without a route (RocketMQ reports it as unavailable) at the
    # head of the due queue, and three rows of a good topic after them
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, max_retries=1)
    with db.engine.begin() as conn:
        bad = [outbox.publish(conn, "NOROUTE", {"i": i}, biz_type="bad", biz_key=str(i))
               for i in range(3)]
        good = [outbox.publish(conn, "GOOD", {"i": i}, biz_type="good", biz_key=str(i))
                for i in range(3)]
    table = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.message_id.in_(bad))
                     .values(next_retry_at=utcnow() - dt.timedelta(minutes=1)))
    transport = FlakyTransport(TransportUnavailable("No route info of this topic: NOROUTE"),
                               fails=lambda m: m.topic == "NOROUTE")
    relay = Relay(db.engine, transport, table=db.names.outbox, batch=10, backoff=FAST)
    # When the relay sends a batch
    stats = relay.step()
    # Then the good rows went out: it was no outage
    assert stats is not None and stats.outage is None
    assert sorted(transport.counts()) == sorted(good)
    # and after two failures of the bad topic its third row was not tried; all three are
    # charged a retry, as failed sends (the broker took the good rows)
    assert transport.attempts == 5 and (stats.sent, stats.retried) == (3, 3)
    for mid in bad:
        r = row(db, mid)
        assert (r["state"], r["retry_count"]) == (int(OutboxState.PENDING), 1)
        assert "No route info" in str(r["fail_reason"])
    # And once more rows of another topic come due with them, their retries run out: FAILED
    with db.engine.begin() as conn:
        late = outbox.publish(conn, "GOOD", {}, biz_type="good", biz_key="late")
    assert relay.step() is not None
    assert {row(db, m)["state"] for m in bad} == {int(OutboxState.FAILED)}
    assert row(db, late)["state"] == int(OutboxState.SENT)



def test_two_topics_without_a_route_at_the_head_cannot_stop_a_third_and_reach_failed(
        db: Db) -> None:
    # Given one due row each of two topics without a route at the head of the queue, then
    # rows of a good topic
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, max_retries=1)
    with db.engine.begin() as conn:
        bad = [outbox.publish(conn, topic, {}, biz_type="bad", biz_key=topic)
               for topic in ("NOROUTE_X", "NOROUTE_Y")]
        good = [outbox.publish(conn, "GOOD", {"i": i}, biz_type="good", biz_key=str(i))
                for i in range(5)]
    table = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.message_id.in_(bad))
                     .values(next_retry_at=utcnow() - dt.timedelta(minutes=1)))
    transport = FlakyTransport(TransportUnavailable("No route info of this topic"),
                               fails=lambda m: m.topic.startswith("NOROUTE"))
    relay = Relay(db.engine, transport, table=db.names.outbox, batch=10, backoff=FAST)
    # When the relay sends a batch
    stats = relay.step()
    # Then the good rows went out and the two bad ones are charged, not an outage
    assert stats is not None and stats.outage is None
    assert sorted(transport.counts()) == sorted(good)
    assert (stats.sent, stats.retried) == (5, 2)
    # And with the next rows of the good topic, their retries run out: FAILED
    with db.engine.begin() as conn:
        late = outbox.publish(conn, "GOOD", {}, biz_type="good", biz_key="late")
    assert wait_for(lambda: (relay.step(), {row(db, m)["state"] for m in bad})[1]
                    == {int(OutboxState.FAILED)}, timeout=10)
    assert row(db, late)["state"] == int(OutboxState.SENT)


def test_failures_of_three_topics_in_a_row_are_an_outage_that_costs_no_retry(db: Db) -> None:
    # Given due rows of four topics and a broker that cannot be reached
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        ids = [outbox.publish(conn, topic, {}, biz_type="t", biz_key=topic)
               for topic in ("A", "B", "C", "D")]
    transport = FlakyTransport(TransportUnavailable("broker down (simulated)"))
    transport.fail_next = 1_000
    relay = Relay(db.engine, transport, table=db.names.outbox)
    # When the relay tries a batch
    stats = relay.step()
    # Then it stopped at the third topic's failure and put every row back uncharged
    assert stats is not None and "4 unsent rows back to PENDING" in str(stats.outage)
    assert transport.attempts == 3
    assert {row(db, m)["retry_count"] for m in ids} == {0}


def test_an_outage_beginning_after_a_send_of_the_batch_costs_no_retry(db: Db) -> None:
    # Given a batch of three topics whose broker goes down after its first send
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        ids = [outbox.publish(conn, topic, {"i": i}, biz_type="t", biz_key=str(i))
               for i, topic in enumerate(("A", "B", "B", "C", "C"))]
    transport = FlakyTransport(TransportUnavailable("broker down (simulated)"),
                               fails=lambda m: m.topic != "A")
    relay = Relay(db.engine, transport, table=db.names.outbox, backoff=FAST)
    rows = sorted(relay.claimer.claim(10), key=lambda r: ids.index(r.message_id))
    # When
    stats = relay.sender.send_rows(rows)
    # Then the first went out, and the rest went back uncharged: an outage
    assert stats.sent == 1 and stats.retried == 0 and stats.outage is not None
    assert {row(db, m)["retry_count"] for m in ids[1:]} == {0}


def test_a_claim_that_takes_half_the_lease_backs_off_instead_of_claiming_again_at_once(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a relay whose claims take 0.6 s under a 1 s lease: no send may start after 0.5 s
    ids = publish_many(sqlite_db, 3)
    transport = RecordingTransport()
    relay = Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                  lease=dt.timedelta(seconds=1), once_outage_limit=1.0)
    claim = relay.claimer.claim
    claims: list[float] = []

    def slow_claim(batch: int) -> list[OutboxRow]:
        claims.append(time.monotonic())
        time.sleep(0.6)
        return claim(batch)

    monkeypatch.setattr(relay.claimer, "claim", slow_claim)
    # When it runs --once
    result = relay.run_once()
    # Then nothing was sent, every row is PENDING uncharged, and it backed off between claims
    # and gave up (exit 1 for `ckit relay --once`) rather than claiming again and again
    assert transport.sent == [] and result.gave_up is not None
    assert "no send started within half the send lease" in result.gave_up
    assert {(row(sqlite_db, m)["state"], row(sqlite_db, m)["retry_count"]) for m in ids} == {
        (int(OutboxState.PENDING), 0)}
    assert len(claims) <= 3


@pytest.mark.parametrize("topics", [["T"] * 6, ["A"] * 5 + ["B"]])
def test_failures_of_a_topic_with_successes_between_them_neither_stop_it_nor_skip_its_rows(
        db: Db, topics: list[str]) -> None:
    # Given a batch whose 2nd and 4th sends fail as unavailable, each followed by a success
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        ids = [outbox.publish(conn, topic, {"i": i}, biz_type="t", biz_key=str(i))
               for i, topic in enumerate(topics)]
    flaky = {ids[1], ids[3]}
    transport = FlakyTransport(TransportUnavailable("timed out"),
                               fails=lambda m: m.properties["ckit_id"] in flaky)
    relay = Relay(db.engine, transport, table=db.names.outbox, backoff=FAST)
    rows = sorted(relay.claimer.claim(10), key=lambda r: ids.index(r.message_id))
    # When
    stats = relay.sender.send_rows(rows)
    # Then every row was tried: the two failures are charged, the rest sent, no outage
    assert transport.attempts == len(ids)
    assert (stats.sent, stats.retried, stats.released, stats.outage) == (
        len(ids) - 2, 2, 0, None)
    assert {m for m in ids if row(db, m)["state"] == int(OutboxState.SENT)} == set(ids) - flaky


def test_a_topic_failing_after_another_topic_went_through_is_charged_not_an_outage(
        db: Db) -> None:
    # Given a batch whose good rows come first and whose last rows have no route
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        good = outbox.publish(conn, "GOOD", {}, biz_type="good", biz_key="1")
        bad = [outbox.publish(conn, "NOROUTE", {"i": i}, biz_type="bad", biz_key=str(i))
               for i in range(2)]
    transport = FlakyTransport(TransportUnavailable("No route info of this topic: NOROUTE"),
                               fails=lambda m: m.topic == "NOROUTE")
    relay = Relay(db.engine, transport, table=db.names.outbox, backoff=FAST)
    rows = sorted(relay.claimer.claim(10), key=lambda r: r.topic != "GOOD")
    # When
    stats = relay.sender.send_rows(rows)
    # Then the broker took the other topic in this batch: the bad rows are charged a retry
    assert (stats.sent, stats.retried, stats.released, stats.outage) == (1, 2, 0, None)
    assert row(db, good)["state"] == int(OutboxState.SENT)
    assert {(row(db, m)["state"], row(db, m)["retry_count"]) for m in bad} == {
        (int(OutboxState.PENDING), 1)}


def _stop_in_a_paced_batch(db: Db, claim: str) -> None:
    # Given: 20 rows and a relay capped at 10 sends a second (batches of 10, 0.1 s apart)
    publish_many(db, 20)
    transport = RecordingTransport()
    relay = Relay(db.engine, transport, table=db.names.outbox, max_rate=10, claim=claim,
                  lease=dt.timedelta(seconds=30))
    worker = threading.Thread(target=relay.run, daemon=True)
    worker.start()
    assert wait_for(lambda: len(transport.sent) >= 3)
    # When: it is stopped in the middle of its first batch
    relay.stop()
    at_stop = len(transport.sent)
    worker.join(5)
    # Then: it returned at once, sent at most the send already under way, and every row is
    # SENT or PENDING (none left leased): the rest of the batch is due again, not lost
    assert not worker.is_alive()
    assert len(transport.sent) <= at_stop + 1 < 10
    with db.engine.connect() as conn:
        states = dict(conn.execute(sa.text(
            f"SELECT state, COUNT(*) FROM {db.names.outbox} GROUP BY state")).all())
    assert states == {int(OutboxState.SENT): len(transport.sent),
                      int(OutboxState.PENDING): 20 - len(transport.sent)}


def test_a_stop_during_a_paced_batch_sends_no_burst_and_releases_the_rest(db: Db) -> None:
    _stop_in_a_paced_batch(db, "lease")


def test_a_stop_during_a_paced_locked_batch_sends_no_burst_and_leaves_the_rest(
        server_db: Db) -> None:
    _stop_in_a_paced_batch(server_db, "lock")


def test_the_rate_cap_holds_across_worker_threads() -> None:
    # Given: one bucket of 100 tokens a second, shared by 8 threads (a relay's workers)
    limiter = RateLimiter(100)
    stop = threading.Event()
    taken: list[float] = []
    started = time.monotonic()

    def work() -> None:
        while time.monotonic() - started < 1.0:
            if limiter.acquire(stop):
                taken.append(time.monotonic())

    # When: they all take tokens for a second
    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then: no more than the cap allowed over that time (one slot each, never shared)
    spent = max(taken) - started
    assert len(taken) <= 100 * spent + 1, (len(taken), spent)
