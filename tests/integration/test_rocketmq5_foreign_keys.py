"""A foreign producer's KEYS over `rocketmq5://` on the real 5.x cluster: the dedupe id is the
first KEYS entry the sender gave, as over `rocketmq://` (the 5.x client hands the keys over as
a set, and sorting it made "order-1001 cust-7" dedupe on "cust-7": every later order of
customer 7 was acked as a duplicate)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer_kit import ConsumerApp, Message
from consumer_kit.core.messages import Verdict, as_verdict
from consumer_kit.testing.harness import unique, wait_for
from consumer_kit.transports import ConsumeStatus, Delivery
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services
from tests.consumer.conftest import Env, _env, add_reservation
from tests.harnesses.rocketmq5 import transport as rocketmq5_transport
from tests.integration.foreign import RawProducer
from tests.integration.test_rocketmq_e2e import running

pytestmark = [pytest.mark.rocketmq5, pytest.mark.rocketmq, pytest.mark.slow]

TIMEOUT = 60.0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    services.require("rocketmq5", services.ping_rocketmq5)
    yield from _env("sqlite", tmp_path)


@pytest.fixture
def transport() -> Iterator[RocketMQ5Transport]:
    made = rocketmq5_transport()
    yield made
    made.close()


def test_a_4x_producers_keys_dedupe_on_their_first_entry_not_the_first_in_sorted_order(
        env: Env, transport: RocketMQ5Transport) -> None:
    # Given a group consuming a topic of a producer that does not use consumer-kit
    assert transport.admin is not None
    topic, group = unique("foreignkeys5"), unique("foreignkeys5-g")
    transport.admin.create_typed_topic(topic, message_type="NORMAL", queues=1)
    app = ConsumerApp(group=group, db=env.db.engine, redis=env.redis, transport=transport,
                      processed_table=env.db.names.processed, threads=1, receipts=None)
    calls: list[Message] = []

    @app.listener(topic)
    def reserve(msg: Message, session: Any) -> None:
        calls.append(msg)
        add_reservation(env, session, msg.json()["sku"])

    answers: list[ConsumeStatus] = []
    process = app.process

    def counting(delivery: Delivery) -> ConsumeStatus | Verdict:
        answer = process(delivery)
        answers.append(as_verdict(answer).status)
        return answer

    app.process = counting  # type: ignore[method-assign]
    with running(app):
        # When a 4.x client sends two orders of one customer to the 5.x name server, the order
        # id first in KEYS and the customer id after it ("cust-7" sorts first)
        with RawProducer(services.rocketmq5_namesrv_addr()) as producer:
            producer.send(topic, {"sku": "A"}, keys="order-1001 cust-7")
            producer.send(topic, {"sku": "B"}, keys="order-1002 cust-7")
        assert wait_for(lambda: answers.count(ConsumeStatus.CONSUME_SUCCESS) == 2, TIMEOUT,
                        interval=0.25), answers
    # Then both are applied, each under its order id, with its keys in the sender's order
    assert env.effects() == {"A": 1, "B": 1}
    assert [m for m, _, _ in env.processed()] == ["order-1001", "order-1002"]
    assert sorted(m.keys for m in calls) == [("order-1001", "cust-7"), ("order-1002", "cust-7")]
