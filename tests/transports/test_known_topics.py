"""With `create_topics`, a transport asks the name server about a topic once, not before every
send; a send that fails makes it ask again, so a topic an operator deleted is created anew
instead of failing every send until a restart. The real brokers of the suite create missing
topics themselves on a send (`autoCreateTopicEnable`), so this is proved here with the real
client's message objects and a producer and name server that are stand-ins."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit.core.errors import TransportError
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.transports.rocketmq import RocketMQTransport
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport

TOPIC = "KNOWN_TOPICS_T"


class NameServer:
    """The admin a transport asks for routes: the topic exists until `deleted` is set."""

    def __init__(self) -> None:
        self.deleted = False
        self.asked = 0
        self.created: list[str] = []

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        self.asked += 1
        return None if self.deleted else {"brokerDatas": [{"brokerName": "broker-a"}]}

    def create_topic(self, topic: str, **_: Any) -> None:
        self.created.append(topic)
        self.deleted = False

    create_typed_topic = create_topic


class Producer:
    """Sends succeed while the name server has the topic."""

    def __init__(self, names: NameServer, kind: str) -> None:
        self.names = names
        self.kind = kind
        self.sent = 0

    def send(self, _message: Any) -> Any:
        if self.names.deleted:  # each client's words for a topic without a route
            raise RuntimeError(f"No route info of this topic: {TOPIC}" if self.kind == "rocketmq"
                               else f"failed to fetch topic={TOPIC} route")
        self.sent += 1
        return type("Receipt", (), {"msg_id": f"M{self.sent}", "message_id": f"M{self.sent}",
                                    "offset": self.sent, "status": 0})()

    send_sync = send


def sent_once(kind: str) -> tuple[NameServer, Any]:
    """A name server and a transport of `kind` that sent one message to the topic."""
    names = NameServer()
    made: Any
    if kind == "rocketmq":
        made = RocketMQTransport("127.0.0.1:1", create_topics=True)
    else:
        made = RocketMQ5Transport("rocketmq5://127.0.0.1:1?namesrv=127.0.0.1:2",
                                  create_topics=True)
    made.admin = names
    made._producer = Producer(names, kind)
    made.send(OutgoingMessage(TOPIC, b'{"n": 1}'))
    return names, made


@pytest.mark.parametrize("kind", ["rocketmq", "rocketmq5"])
def test_a_topic_deleted_after_its_first_send_is_created_again_after_the_failed_send(
        kind: str) -> None:
    # Given: a transport that sent to the topic, which the name server then lost
    names, sender = sent_once(kind)
    sender.send(OutgoingMessage(TOPIC, b'{"n": 2}'))
    assert names.asked == 1  # once per topic, not before every send
    names.deleted = True
    # When: the next send fails, and the one after it is tried
    with pytest.raises(TransportError):
        sender.send(OutgoingMessage(TOPIC, b'{"n": 3}'))
    sender.send(OutgoingMessage(TOPIC, b'{"n": 3}'))
    # Then: the transport asked the name server again and created the topic before sending
    assert names.created == [TOPIC]
    assert sender._producer.sent == 3


@pytest.mark.parametrize("kind", ["rocketmq", "rocketmq5"])
def test_a_send_that_failed_for_another_reason_does_not_ask_the_name_server_again(
        kind: str) -> None:
    # Given a transport that sent to the topic once
    names, sender = sent_once(kind)
    # When a send times out (a broker away: its topic may be missing from the name server for
    # a while, and must not be created anew on the other brokers for that)
    def timed_out(_message: Any) -> Any:
        raise RuntimeError("send timeout")
    sender._producer.send = sender._producer.send_sync = timed_out
    with pytest.raises(TransportError):
        sender.send(OutgoingMessage(TOPIC, b'{"n": 2}'))
    names.deleted = True
    with pytest.raises(TransportError):
        sender.send(OutgoingMessage(TOPIC, b'{"n": 3}'))
    # Then the name server was asked once, and nothing was created
    assert (names.asked, names.created) == (1, [])
