"""Receipts are durable: the processed row owes them until they are delivered, duplicates of a
re-send answer with one, and a rejected row an operator retries reaches its group again."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Reject
from consumer_kit.core.clock import utcnow
from consumer_kit.core.messages import ConsumeStatus, Delivery
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.schema import ProcessedStatus
from consumer_kit.core.states import OutboxState
from consumer_kit.metrics import RECEIPTS_OWED
from consumer_kit.processed import ProcessedStore
from consumer_kit.receipts import ReceiptRoute, ReceiptSender, SqlRoute
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Relay, ops
from tests.consumer.conftest import Env, add_reservation
from tests.consumer.test_receipts_back import outbox_state, publish_and_relay


class Down(ReceiptRoute):
    """A producer that is away for the first `failures` batches."""

    name = "test"

    def __init__(self, inner: ReceiptRoute, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("producer database down (simulated)")
        self.inner.deliver(producer, receipts)


def sql_route(env: Env) -> SqlRoute:
    return SqlRoute(env.db.url, outbox_table=env.db.names.outbox,
                    receipt_table=env.db.names.receipts)


def listen(env: Env, app: ConsumerApp, *, reject: set[str] | None = None) -> None:
    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        sku = msg.json()["sku"]
        if reject and sku in reject:
            raise Reject(f"sku {sku} unknown")
        add_reservation(env, session, sku)


def test_receipts_owed_by_a_consumer_that_died_are_delivered_by_the_next_one(env: Env) -> None:
    # Given a consumer that processed three messages and died before its receipts went out
    # (its route never answered; nothing of it survives but the processed table)
    transport = MemoryTransport()
    ids = publish_and_relay(env, transport, [{"sku": "A"}, {"sku": "B"}, {"sku": "C"}])
    dead = env.app(transport=transport, receipts=Down(sql_route(env), failures=10**6))
    listen(env, dead)
    dead.run(burst=True, max_seconds=30)
    assert dead.pipeline().store.owed() == 3
    assert {outbox_state(env, m)[0] for m in ids} == {int(OutboxState.SENT)}
    dead.close()  # (its route still fails: what it queued stays owed)
    # When another consumer of the group starts (its sender scans the table for what is owed)
    store = ProcessedStore(env.db.engine, dead.group, table=env.db.names.processed)
    with env.db.engine.begin() as conn:  # their back-off is over
        conn.execute(sa.text(f"UPDATE {env.db.names.processed} SET receipt_due_at = :t"),
                     {"t": utcnow() - dt.timedelta(minutes=1)})
    sender = ReceiptSender(sql_route(env), store, scan_every=0.1)
    try:
        # Then every row reaches CONSUMED without the reconciler, and nothing is owed
        assert wait_for(lambda: all(outbox_state(env, m)[0] == OutboxState.CONSUMED
                                    for m in ids), 15)
        assert wait_for(lambda: store.owed() == 0, 5)
    finally:
        sender.close()
    assert env.effects() == {"A": 1, "B": 1, "C": 1}


def test_a_producer_that_is_down_delays_receipts_and_never_drops_them(env: Env) -> None:
    # Given a producer database that fails the first three deliveries
    transport = MemoryTransport()
    [mid] = publish_and_relay(env, transport, [{"sku": "A"}])
    app = env.app(transport=transport)
    listen(env, app)
    store = app.pipeline().store
    route = Down(sql_route(env), failures=3)
    sender = ReceiptSender(route, store, scan_every=0.05, grace=dt.timedelta(0))
    sender.put("orders", Receipt(mid, app.group))  # (the pipeline's own sender is off)
    try:
        with env.db.engine.begin() as conn:  # the row the pipeline would have written
            conn.execute(sa.insert(store.table).values(
                consumer_group=app.group, message_id=mid, topic="ORDER_CREATED", src="orders",
                status="SUCCEEDED", attempts=1, first_seen_at=utcnow(), processed_at=utcnow(),
                receipt_due_at=utcnow(), receipt_attempts=0))
        # When the sender keeps trying (back-off 1 s, 2 s, 4 s)
        delivered = wait_for(lambda: outbox_state(env, mid)[0] == OutboxState.CONSUMED, 30)
        # Then the receipt arrives once the producer is back; each failure was owed again
        assert delivered and route.calls >= 4 and sender.failed_batches == 3
        assert wait_for(lambda: store.owed() == 0, 5)
        assert wait_for(lambda: RECEIPTS_OWED.labels(app.group)._value.get() == 0, 5)
    finally:
        sender.close()
        app.close()


def test_a_re_sent_message_that_was_processed_answers_with_a_receipt(env: Env) -> None:
    # Given a message consumed and CONSUMED on the producer side
    transport = MemoryTransport()
    [mid] = publish_and_relay(env, transport, [{"sku": "A"}])
    app = env.app(transport=transport, receipts=env.db.url,
                  receipt_outbox_table=env.db.names.outbox, receipt_table=env.db.names.receipts)
    listen(env, app)
    app.run(burst=True, max_seconds=30)
    assert outbox_state(env, mid)[0] == OutboxState.CONSUMED
    # When an operator re-sends it (its receipt rows are deleted; the relay sends it again,
    # marked as a re-send)
    tables = ops.OutboxTables.from_names(env.db.names)
    assert ops.retry(env.db.engine, tables, [f"msg:{mid}"], force=True).changed
    Relay(env.db.engine, transport, table=env.db.names.outbox).run_once()
    app.run(burst=True, max_seconds=30)
    app.close()
    # Then the group answers the duplicate with a receipt (no reconciler), and applies nothing
    # twice
    assert outbox_state(env, mid)[0] == OutboxState.CONSUMED
    assert env.effects() == {"A": 1}
    assert app.pipeline().counts  # the duplicate was counted
    from consumer_kit.outcome import Outcome

    assert app.pipeline().counts[Outcome.DUPLICATE] == 1


def test_a_plain_redelivery_of_a_processed_message_owes_no_new_receipt(env: Env) -> None:
    app = env.app(receipts=sql_route(env))
    listen(env, app)
    store = app.pipeline().store
    d = Delivery("ORDER_CREATED", b'{"sku": "A"}', "B1", tags="created",
                 properties={"ckit_id": "M1", "ckit_src": "orders"})
    assert app.process(d).status is ConsumeStatus.CONSUME_SUCCESS
    sender = app.pipeline().receipts
    assert sender is not None and sender.flush(10) and store.owed() == 0
    # When the broker delivers it again (no ckit_resend)
    assert app.process(d).status is ConsumeStatus.CONSUME_SUCCESS
    # Then nothing is owed again
    assert sender.flush(10) and store.owed() == 0
    app.close()


def test_retry_of_a_rejected_row_reaches_the_rejecting_group_and_ends_consumed(
        env: Env) -> None:
    # Given a message the group rejected (the producer row is REJECTED)
    transport = MemoryTransport()
    [mid] = publish_and_relay(env, transport, [{"sku": "NEW"}])
    unknown = {"NEW"}
    app = env.app(transport=transport, receipts=sql_route(env))
    listen(env, app, reject=unknown)
    app.run(burst=True, max_seconds=30)
    assert outbox_state(env, mid) == (int(OutboxState.REJECTED),
                                      f"{app.group}: sku NEW unknown")
    # When the sku is known now and an operator retries the row
    unknown.clear()
    tables = ops.OutboxTables.from_names(env.db.names)
    assert ops.retry(env.db.engine, tables, [f"msg:{mid}"]).changed
    Relay(env.db.engine, transport, table=env.db.names.outbox).run_once()
    app.run(burst=True, max_seconds=30)
    app.close()
    # Then the handler ran again, once, and the row is CONSUMED without the reconciler
    assert env.effects() == {"NEW": 1}
    assert outbox_state(env, mid)[0] == OutboxState.CONSUMED
    assert [(m, s) for m, s, _e in env.processed()] == [(mid, "SUCCEEDED")]


def test_the_last_attempt_records_the_reason_and_rejects_the_outbox_row(env: Env) -> None:
    # Given a handler that always fails, on its group's last attempt
    transport = MemoryTransport()
    [mid] = publish_and_relay(env, transport, [{"sku": "A"}])
    app = env.app(transport=transport, receipts=sql_route(env))

    @app.listener("ORDER_CREATED")
    def explode(msg: Message, session: Any) -> None:
        raise RuntimeError("the warehouse API is down")

    d = Delivery("ORDER_CREATED", b'{"sku": "A"}', "B1", tags="created",
                 properties={"ckit_id": mid, "ckit_src": "orders"}, reconsume_times=2,
                 max_reconsume_times=2, last_error="RuntimeError: the warehouse API is down")
    # When it fails once more
    verdict = app.process(d)
    sender = app.pipeline().receipts
    assert sender is not None and sender.flush(10)
    app.close()
    # Then the transport is told to redeliver it (so it dead-letters it) with the reason, the
    # processed row says DEAD_LETTERED and why, and the producer's row is REJECTED with it
    assert verdict.status is ConsumeStatus.RECONSUME_LATER
    assert "the warehouse API is down" in verdict.reason
    [(_m, status, error)] = env.processed()
    assert status == ProcessedStatus.DEAD_LETTERED.value
    assert "retries spent after 3 deliveries" in str(error)
    state, reason = outbox_state(env, mid)
    assert state == OutboxState.REJECTED and "the warehouse API is down" in str(reason)


def test_purge_keeps_rows_whose_receipt_is_still_owed(env: Env) -> None:
    app = env.app(receipts=Down(sql_route(env), failures=10**6))
    listen(env, app)
    store = app.pipeline().store
    for i in range(2):
        app.process(Delivery("ORDER_CREATED", b'{"sku": "A"}', f"B{i}", tags="created",
                             properties={"ckit_id": f"M{i}", "ckit_src": "orders"}))
    app.process(Delivery("ORDER_CREATED", b'{"sku": "B"}', "B9", tags="created",
                         properties={"ckit_id": "foreign"}))  # no src: no receipt owed
    sender = app.pipeline().receipts
    assert sender is not None and sender.flush(10)
    # When everything is old enough to purge
    deleted = store.purge(dt.timedelta(0))
    # Then only the row that owes nothing went
    assert deleted == 1 and store.owed() == 2
    app.close()


@pytest.mark.parametrize("threads", [4])
def test_receipts_of_concurrent_consumers_arrive_once_each(env: Env, threads: int) -> None:
    transport = MemoryTransport()
    ids = publish_and_relay(env, transport, [{"sku": f"S{i}"} for i in range(40)])
    app = env.app(transport=transport, receipts=sql_route(env), threads=threads)
    listen(env, app)
    done = threading.Event()
    app.run(burst=True, max_seconds=60, stop=done)
    app.close()
    assert {outbox_state(env, m)[0] for m in ids} == {int(OutboxState.CONSUMED)}
    assert sum(env.effects().values()) == 40
