"""Members of one group that subscribe different topics: RocketMQ's allocation shares every
queue among all members, so the queues a member is given of a topic it does not subscribe are
consumed by no one. The SQL transport cannot share them right, but it must not stay silent."""

from __future__ import annotations

import logging
import time

import pytest

from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.sql import SqlTransport

TIMEOUT = 10.0


def done(_: Delivery) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


def subscription_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "subscribe" in r.getMessage()]


def test_members_of_one_group_subscribing_different_topics_are_warned(
        transport: SqlTransport, caplog: pytest.LogCaptureFixture) -> None:
    # Given two members of one group, one on topic mixed_a and one on mixed_b (a copied group
    # name, or a rolling deploy that adds a listener)
    caplog.set_level(logging.WARNING, logger="consumer_kit.transports.sql")
    a = transport.consumer("mixed_g", [Subscription("mixed_a")], done)
    b = transport.consumer("mixed_g", [Subscription("mixed_b")], done)
    a.start()
    b.start()
    try:
        for i in range(8):
            transport.send(OutgoingMessage("mixed_a", f"a{i}".encode()))
            transport.send(OutgoingMessage("mixed_b", f"b{i}".encode()))
        # When they have shared the queues
        # Then each is told that the other holds a topic it does not subscribe, by name
        assert wait_for(lambda: len(subscription_warnings(caplog)) >= 2, TIMEOUT)
        text = "\n".join(subscription_warnings(caplog))
        assert "mixed_g" in text
        assert "mixed_a" in text and "mixed_b" in text
        assert b.member_id in text and a.member_id in text
        # once per topic, not at every rebalance
        time.sleep(2.0)
        assert len(subscription_warnings(caplog)) == 2
    finally:
        a.shutdown()
        b.shutdown()


def test_members_subscribing_the_same_topics_say_nothing(
        transport: SqlTransport, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="consumer_kit.transports.sql")
    subscriptions = [Subscription("same_a"), Subscription("same_b")]
    got: list[Delivery] = []

    def collect(d: Delivery) -> ConsumeStatus:
        got.append(d)
        return ConsumeStatus.CONSUME_SUCCESS

    members = [transport.consumer("same_g", subscriptions, collect) for _ in range(2)]
    for member in members:
        member.start()
    try:
        for i in range(8):
            transport.send(OutgoingMessage("same_a", f"a{i}".encode()))
            transport.send(OutgoingMessage("same_b", f"b{i}".encode()))
        assert wait_for(lambda: len(got) == 16, TIMEOUT)
        time.sleep(1.5)  # a few rebalances
        assert subscription_warnings(caplog) == []
    finally:
        for member in members:
            member.shutdown()
