"""`create_topics=True` on RocketMQ 5: a missing topic is created once, not looked up per send."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit.testing.harness import unique
from consumer_kit.transports import OutgoingMessage
from tests import services
from tests.harnesses.rocketmq5 import transport as make_transport

pytestmark = [pytest.mark.rocketmq5]


def test_a_producer_asks_the_name_server_about_a_topic_once_not_per_send() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    # Given a producer that creates its topics, and a count of its name-server route look-ups
    t = make_transport(create_topics=True)
    assert t.admin is not None
    looked_up: list[str] = []
    real = t.admin.topic_route

    def counting(topic: str) -> Any:
        looked_up.append(topic)
        return real(topic)

    t.admin.topic_route = counting  # type: ignore[method-assign]
    topic = unique("created5")
    try:
        # When it sends 20 messages to a topic that does not exist yet
        for i in range(20):
            t.send(OutgoingMessage(topic, f"m{i}".encode()))
    finally:
        t.close()
    # Then the topic was created (the sends went through) and looked up when it was created
    # only: once to find it missing, then while waiting for its route (20 before)
    assert 1 <= looked_up.count(topic) <= 3
    assert real(topic) is not None
