"""A group consuming two producers' messages sends each producer's receipts straight to its own
database (`receipts={"orders": URL, "payments": URL}`); a producer without a route is named in
a warning, and a setting that names no route is refused before anything runs."""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message
from consumer_kit import receipts as receipts_module
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.core.states import OutboxState
from consumer_kit.receipts import ByProducer
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Outbox, Relay
from tests.conftest import Db, database_url
from tests.consumer.conftest import Env, add_reservation


@pytest.fixture
def payments(env: Env, tmp_path: Path) -> Iterator[Db]:
    """A second producer's database (the server's other database; another SQLite file), with
    outbox tables named as the first producer's."""
    url = database_url(env.kind, tmp_path, second=True)
    engine = make_engine(url)
    names: TableNames = env.db.names
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(engine)
    try:
        yield Db(engine, names, env.kind, url)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def publish(db: Db, producer: str, transport: MemoryTransport, skus: list[str]) -> list[str]:
    outbox = Outbox(db.engine, producer=producer, table=db.names.outbox)
    with db.engine.begin() as conn:
        ids = [outbox.publish(conn, "ORDER_CREATED", {"sku": sku}, biz_type=producer,
                              biz_key=sku) for sku in skus]
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    return ids


def states(db: Db, ids: list[str]) -> set[int]:
    t = sa.table(db.names.outbox, sa.column("message_id"), sa.column("state"))
    with db.engine.connect() as conn:
        return {int(s) for s in conn.execute(sa.select(t.c.state).where(
            t.c.message_id.in_(ids))).scalars()}


def consume(env: Env, transport: MemoryTransport, receipts: Any) -> ConsumerApp:
    app = env.app(transport=transport, receipts=receipts,
                  receipt_outbox_table=env.db.names.outbox,
                  receipt_table=env.db.names.receipts)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.json()["sku"])

    app.run(burst=True, max_seconds=30)
    return app


def test_each_producers_receipts_reach_its_own_database(env: Env, payments: Db) -> None:
    # Given orders and payments, each with its own database, publishing to one group
    transport = MemoryTransport()
    orders_ids = publish(env.db, "orders", transport, ["A", "B"])
    payment_ids = publish(payments, "payments", transport, ["C"])
    # When the group consumes them with a database route per producer
    app = consume(env, transport, {"orders": env.db.url, "payments": payments.url})
    try:
        # Then every message is CONSUMED in its own producer's outbox, without a reconciler
        assert wait_for(lambda: states(env.db, orders_ids) == {int(OutboxState.CONSUMED)}
                        and states(payments, payment_ids) == {int(OutboxState.CONSUMED)}, 15)
        assert wait_for(lambda: app.pipeline().store.owed() == 0, 30)
    finally:
        app.close()
    assert env.effects() == {"A": 1, "B": 1, "C": 1}


def test_a_star_routes_every_producer_not_named(env: Env, payments: Db) -> None:
    transport = MemoryTransport()
    orders_ids = publish(env.db, "orders", transport, ["A"])
    payment_ids = publish(payments, "payments", transport, ["C"])
    app = consume(env, transport, {"orders": env.db.url, "*": payments.url})
    try:
        assert wait_for(lambda: states(env.db, orders_ids) == {int(OutboxState.CONSUMED)}
                        and states(payments, payment_ids) == {int(OutboxState.CONSUMED)}, 15)
    finally:
        app.close()


def payments_left(env: Env, payments: Db, caplog: pytest.LogCaptureFixture,
                  receipts: dict[str, str | None]) -> list[str]:
    """orders and payments publish (one and two messages) to a group with `receipts`, which
    routes orders' receipts to its database and none of payments': orders' row reaches
    CONSUMED, payments' rows stay SENT for their reconciler, nothing stays owed. The
    warnings that named payments."""
    transport = MemoryTransport()
    orders_ids = publish(env.db, "orders", transport, ["A"])
    payment_ids = publish(payments, "payments", transport, ["C", "D"])
    caplog.set_level(logging.WARNING, logger="consumer_kit.receipts")
    app = consume(env, transport, receipts)
    try:
        assert wait_for(lambda: states(env.db, orders_ids) == {int(OutboxState.CONSUMED)}, 15)
        assert wait_for(lambda: app.pipeline().store.owed() == 0, 30)
    finally:
        app.close()
    assert states(payments, payment_ids) == {int(OutboxState.SENT)}
    return [r.getMessage() for r in caplog.records if "producer payments" in r.getMessage()]


def test_a_producer_without_a_route_is_named_and_left_to_its_reconciler(
        env: Env, payments: Db, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a group whose receipts name orders only, warning at every delivery (the sender
    # may deliver payments' two receipts in one batch or in two, as the threads run)
    monkeypatch.setattr(receipts_module, "UNROUTED_WARN_EVERY", 0.0)
    # When it consumes both producers' messages
    warnings = payments_left(env, payments, caplog, {"orders": env.db.url})
    # Then the warnings name payments and the routes there are, and count both receipts
    counted = [re.match(r"(\d+) receipt\(s\) for producer payments \(message ", w)
               for w in warnings]
    assert warnings and all(counted)
    assert sum(int(m.group(1)) for m in counted if m) == 2
    assert all("names no route for it (orders) and no '*'" in w for w in warnings)


def test_none_turns_one_producers_receipts_off_without_a_warning(
        env: Env, payments: Db, caplog: pytest.LogCaptureFixture) -> None:
    # Given receipts for orders and none for payments (by the setting): nothing is said
    assert payments_left(env, payments, caplog, {"orders": env.db.url, "payments": None}) == []


@pytest.mark.parametrize(("receipts", "says"), [
    ({}, "receipts={} names no producer"),
    ({"orders": "nonsense"}, "invalid receipts['orders']='nonsense'"),
    ({"": "topic"}, "'' is not a producer name"),
    ({"orders": "nonsense://x:s3cret@db/orders"}, None),
    ({"orders": "ckit:s3cret@127.0.0.1/orders"}, "invalid receipts['orders']='***@127.0.0.1"),
    ({"mysql+pymysql://app:s3cret@db/orders": "orders"},  # key and value swapped
     "invalid receipts['mysql+pymysql://app:***@db/orders']='orders'"),
    ("mysql", "invalid receipts='mysql'"),
])
def test_a_receipts_setting_that_names_no_route_is_refused_at_once(
        receipts: Any, says: str | None) -> None:
    if says is None:  # a URL of any scheme is taken; its driver is checked at first use
        ConsumerApp(group="g", db="sqlite://", receipts=receipts, transport="memory://x")
        return
    with pytest.raises(ConfigError) as refused:
        ConsumerApp(group="g", db="sqlite://", receipts=receipts, transport="memory://x")
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_two_threads_delivering_receipts_without_a_route_count_every_one(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Given a route for orders only, warning once in the test's time (the first delivery)
    monkeypatch.setattr(receipts_module, "UNROUTED_WARN_EVERY", 3600.0)
    route = ByProducer({"orders": ByProducer({})})
    receipt = [Receipt("m1", "inventory")]
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        # When two threads deliver payments' receipts at once (the sender and a flush)
        threads = [threading.Thread(target=lambda: [route.deliver("payments", receipt)
                                                    for _ in range(20_000)]) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(before)
    # Then every receipt after the first warning is counted for the next one
    assert route._unrouted["payments"][1] == 2 * 20_000 - 1
