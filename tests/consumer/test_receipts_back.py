"""The producer's outbox row reaches CONSUMED (or REJECTED) through each ack route."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Reject
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.memory import MemoryTransport
from consumer_kit.transports.running import run_consumer
from outbox_producer import Outbox, ReceiptApplier, Relay
from outbox_producer.receipts.consumer import ReceiptConsumer
from tests.consumer.conftest import Env, add_reservation


def outbox_state(env: Env, mid: str) -> tuple[int, str | None]:
    with env.db.engine.connect() as conn:
        r = conn.execute(sa.text(f"SELECT state, fail_reason FROM {env.db.names.outbox} "
                                 "WHERE message_id = :m"), {"m": mid}).one()
        return int(r[0]), r[1]


def publish_and_relay(env: Env, transport: MemoryTransport, payloads: list[dict[str, Any]]
                      ) -> list[str]:
    outbox = Outbox(env.db.engine, producer="orders", table=env.db.names.outbox)
    with env.db.engine.begin() as conn:
        ids = [outbox.publish(conn, "ORDER_CREATED", p, biz_type="order", biz_key=str(i))
               for i, p in enumerate(payloads)]
    Relay(env.db.engine, transport, table=env.db.names.outbox).run_once()
    return ids


def listen(env: Env, app: ConsumerApp) -> None:
    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        sku = msg.json()["sku"]
        if sku == "gone":
            raise Reject("sku discontinued")
        add_reservation(env, session, sku)


@pytest.mark.parametrize("route", ["sql", "topic"])
def test_the_outbox_row_reaches_consumed_or_rejected_through_each_ack_route(
    env: Env, route: str
) -> None:
    # Given
    transport = MemoryTransport()
    ok, bad = publish_and_relay(env, transport, [{"sku": "A"}, {"sku": "gone"}])
    ack = env.db.url if route == "sql" else "topic"
    app = env.app(transport=transport, receipts=ack, receipt_outbox_table=env.db.names.outbox,
                  receipt_table=env.db.names.receipts)
    listen(env, app)
    # When
    app.run(burst=True, max_seconds=30)
    app.close()
    if route == "topic":
        applier = ReceiptApplier(env.db.engine, table=env.db.names.outbox,
                             receipt_table_name=env.db.names.receipts)
        acks = ReceiptConsumer(applier, transport, producer="orders")
        run_consumer(acks.consumer(), threading.Event(), burst=True, max_seconds=30)
    # Then
    assert outbox_state(env, ok) == (int(OutboxState.CONSUMED), None)
    assert outbox_state(env, bad) == (int(OutboxState.REJECTED), f"{app.group}: sku discontinued")
    assert env.effects() == {"A": 1}


def test_a_failing_receipt_route_never_fails_the_message_and_the_receipt_stays_owed(
        env: Env) -> None:
    # Given a receipt route that cannot reach the producer's database
    transport = MemoryTransport()
    [mid] = publish_and_relay(env, transport, [{"sku": "A"}])
    app = env.app(transport=transport, receipts="mysql+pymysql://u:SECRET@127.0.0.1:1/none")
    listen(env, app)
    # When the message is consumed
    app.run(burst=True, max_seconds=30)
    sender = app.pipeline().receipts
    assert sender is not None and sender.flush(30)
    # Then the effect is applied once, the delivery failed, and the processed row still owes
    # the receipt (a later start or scan delivers it: nothing is given up)
    assert env.effects() == {"A": 1}
    assert sender.failed_batches >= 1 and sender.delivered == 0
    assert app.pipeline().store.owed() == 1
    assert outbox_state(env, mid)[0] == OutboxState.SENT
    app.close()
