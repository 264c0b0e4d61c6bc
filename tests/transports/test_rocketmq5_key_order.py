"""A message received over `rocketmq5://` keeps its KEYS in the sender's order, so a foreign
message (no `ckit_id`) dedupes on its first key, as over `rocketmq://`: the 5.x client hands
them over as a set, and sorting it made "order-1001 cust-7" dedupe on "cust-7". Where the order
cannot be kept (a client version not checked), the id is all the keys, never one by chance."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from consumer_kit import Message
from consumer_kit.transports.rocketmq5 import client
from consumer_kit.transports.rocketmq5.wire import received_delivery, stored_delivery


def protobuf(keys: list[str]) -> Any:
    """A message as the proxy sends it (its `keys` a repeated field, in the sender's order)."""
    from rocketmq.grpc_protocol import DigestType, Encoding, definition_pb2
    from rocketmq.v5.util import Misc

    pb = definition_pb2.Message()
    pb.topic.name = "ORDERS"
    pb.body = b'{"order": 1}'
    pb.system_properties.keys.extend(keys)
    pb.system_properties.message_id = "UNIQ-1"
    pb.system_properties.body_encoding = Encoding.IDENTITY
    pb.system_properties.body_digest.type = DigestType.CRC32
    pb.system_properties.body_digest.checksum = Misc.crc32_checksum(pb.body)
    return pb


def receive(keys: list[str]) -> Message:
    """The handler's message for a received protobuf, built as the client's consumer builds it."""
    client.v5()
    from rocketmq.v5.consumer import consumer as module

    built = module.Message().fromProtobuf(protobuf(keys))
    return Message.from_delivery(received_delivery(built, reason="", max_reconsume_times=None))


def test_a_received_message_keeps_its_keys_in_the_senders_order() -> None:
    # Given two messages of a Java producer, the order id first and the customer after
    # When the client's consumer builds them
    first, second = receive(["order-1001", "cust-7"]), receive(["order-1002", "cust-7"])
    # Then each dedupes on its first key (sorted, both were "cust-7": one a duplicate)
    assert (first.id, second.id) == ("order-1001", "order-1002")
    assert first.keys == ("order-1001", "cust-7")
    assert receive(["z-9", "b-2", "m-5"]).keys == ("z-9", "b-2", "m-5")


def test_a_client_version_not_checked_is_left_alone_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Given a 5.x client of a version whose receive path was not read
    client.v5()
    from rocketmq.v5.consumer import consumer as module
    from rocketmq.v5.model import Message as ClientMessage

    monkeypatch.setattr(module, "Message", ClientMessage)
    monkeypatch.setattr(client.importlib.metadata, "version", lambda name: "5.9.0")
    # When consumer-kit would hook it
    with caplog.at_level(logging.WARNING, logger=client.log.name):
        hooked = client.keep_received_key_order()
    # Then it is not touched, and the log says what that means
    assert not hooked and module.Message is ClientMessage
    assert "5.9.0" in caplog.text and "dedupes on all of them" in caplog.text


def test_keys_whose_order_was_lost_dedupe_on_all_of_them_not_on_one_by_chance() -> None:
    # Given messages from a client that hands over KEYS as a set only (no order kept)
    def lost(*keys: str) -> Message:
        message = SimpleNamespace(topic="ORDERS", body=b"{}", message_id="UNIQ-1", tag="",
                                  keys=set(keys), properties={}, delivery_attempt=1,
                                  born_timestamp=1)
        return Message.from_delivery(received_delivery(message, reason="",
                                                       max_reconsume_times=None))

    # When two orders of one customer arrive, and an order with one key
    first, second, single = lost("order-1001", "cust-7"), lost("order-1002", "cust-7"), lost("k")
    # Then neither dedupes on the shared "cust-7": each id is its whole key set
    assert (first.id, second.id) == ("cust-7 order-1001", "cust-7 order-1002")
    assert single.id == "k"


def test_a_dead_letter_keeps_its_keys_in_the_senders_order() -> None:
    # Given a dead letter as the broker stores it (KEYS one string, in the sender's order)
    letter = stored_delivery("%DLQ%g", b"{}", {"KEYS": "order-1001 cust-7"}, reconsume_times=3,
                             queue_id=0, queue_offset=0, born_timestamp_ms=1)
    # When read back, Then the order is the sender's
    assert Message.from_delivery(letter).keys == ("order-1001", "cust-7")
