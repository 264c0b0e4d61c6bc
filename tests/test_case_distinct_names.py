"""Ids, keys, topics and group names that differ only in case are different on MariaDB too.

MariaDB's default utf8mb4 collation ignores case: with it a group `billing` read the offsets of
a group `Billing` (and got nothing), a topic `ORDERS` fed the consumers of `orders`, and a biz
key `order-1` was taken for `Order-1` (publish returned the other message's id). Every table
is made with a binary collation (`consumer_kit.core.schema.types.MYSQL_TABLE`)."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from consumer_kit.core.schema import mq_tables
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.sql import SqlTransport
from outbox_producer import Outbox
from tests import services
from tests.conftest import Db

pytestmark = pytest.mark.mariadb


@pytest.fixture
def mq() -> Iterator[SqlTransport]:
    url = services.mysql_url()
    services.require("mariadb", lambda: services.ping_mysql(url))
    prefix = f"cs{uuid.uuid4().hex[:8]}_mq"
    transport = SqlTransport(url, table_prefix=prefix, create_tables=True, lease_seconds=2,
                             poll_interval=0.02)
    yield transport
    transport.close()
    metadata = sa.MetaData()
    mq_tables(prefix, metadata)
    engine = sa.create_engine(url)
    metadata.drop_all(engine)
    engine.dispose()


def test_groups_and_topics_that_differ_in_case_each_get_their_own_messages(
        mq: SqlTransport) -> None:
    got: collections.Counter[str] = collections.Counter()

    def count(name: str) -> object:
        def handler(delivery: Delivery) -> ConsumeStatus:
            got[f"{name}:{delivery.topic}"] += 1
            return ConsumeStatus.CONSUME_SUCCESS
        return handler

    # Given 10 messages on `orders` and 5 on `ORDERS`, and a group Billing that read `orders`
    for i in range(10):
        mq.send(OutgoingMessage("orders", f"o{i}".encode()))
    for i in range(5):
        mq.send(OutgoingMessage("ORDERS", f"O{i}".encode()))
    first = mq.consumer("Billing", [Subscription("orders")], count("Billing"))  # type: ignore[arg-type]
    first.start()
    assert wait_for(lambda: got["Billing:orders"] >= 10, 15)
    first.shutdown(3)
    # When a group billing reads `orders` too
    second = mq.consumer("billing", [Subscription("orders")], count("billing"))  # type: ignore[arg-type]
    second.start()
    wait_for(lambda: got["billing:orders"] >= 10, 15)
    time.sleep(0.5)
    second.shutdown(3)
    # Then each group got the 10 messages of `orders`, and none of `ORDERS`
    assert dict(got) == {"Billing:orders": 10, "billing:orders": 10}


def test_biz_keys_that_differ_in_case_are_two_messages(mariadb: Db) -> None:
    outbox = Outbox(mariadb.engine, producer="orders", table=mariadb.names.outbox)
    with mariadb.engine.begin() as conn:
        upper = outbox.publish(conn, "T", {"n": 1}, biz_type="order", biz_key="Order-1")
        lower = outbox.publish(conn, "T", {"n": 2}, biz_type="order", biz_key="order-1")
    assert upper != lower
    assert mariadb.count(mariadb.names.outbox) == 2
