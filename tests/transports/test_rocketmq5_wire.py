"""The `rocketmq5://` transport's pieces that need no proxy: what a received or stored message
becomes, and its address errors."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from consumer_kit.core.errors import ConfigError
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from consumer_kit.transports.rocketmq5.wire import (
    parse_endpoint,
    received_delivery,
    stored_delivery,
)

BINARY = b"a\x00\xffb"


def received(body: bytes, **properties: str) -> SimpleNamespace:
    """A received 5.x message as the client hands it over."""
    return SimpleNamespace(topic="T", body=body, message_id="M", tag="", keys=["k"],
                           properties=properties, delivery_attempt=1, born_timestamp=1)


def test_a_body_a_4x_sender_base64_encoded_is_decoded_and_its_marks_dropped() -> None:
    message = received(base64.b64encode(BINARY), ckit_enc="b64", ckit_props="x", x="1")
    delivery = received_delivery(message, reason="", max_reconsume_times=None)
    assert delivery.body == BINARY
    assert dict(delivery.properties) == {"x": "1"}


def test_a_received_body_marked_base64_that_is_not_is_an_error() -> None:
    with pytest.raises(ValueError, match="not base64"):
        received_delivery(received(b"%%%", ckit_enc="b64"), reason="", max_reconsume_times=None)


def test_a_dead_letter_a_4x_sender_encoded_reads_back_decoded() -> None:
    delivery = stored_delivery("%DLQ%g", base64.b64encode(BINARY),
                               {"ckit_enc": "b64", "ckit_props": "x", "x": "1", "KEYS": "k"},
                               reconsume_times=3, queue_id=0, queue_offset=0,
                               born_timestamp_ms=1)
    assert (delivery.body, dict(delivery.properties)) == (BINARY, {"x": "1"})


@pytest.mark.parametrize("url", [
    "rocketmq5://ak:S3cr3tPw@127.0.0.1:8081",
    "rocketmq5://127.0.0.1:8081?namesrv=ak:S3cr3tPw@127.0.0.1:9886",
])
def test_an_address_with_a_password_is_refused_at_once_without_showing_it(url: str) -> None:
    # Given a proxy or name-server address carrying user:password (neither takes one)
    # When the transport is made, Then it fails before any connection, the password masked
    with pytest.raises(ConfigError) as refused:
        RocketMQ5Transport(url)
    assert "S3cr3tPw" not in str(refused.value)
    assert "***" in str(refused.value)


def test_a_valid_endpoint_parses_to_its_list_and_options() -> None:
    assert parse_endpoint("rocketmq5://a:1;b:2?namesrv=c:3") == ("a:1;b:2", {"namesrv": "c:3"})


def test_a_message_group_over_the_proxys_64_characters_is_a_stable_digest_form() -> None:
    from consumer_kit.transports.rocketmq5.wire import MESSAGE_GROUP_MAX, message_group

    long_key = "tenant-7/order/" + "x" * 100
    group = message_group(long_key)
    assert len(group) == MESSAGE_GROUP_MAX and group == message_group(long_key)
    assert group != message_group(long_key + "y")  # another key, another group
    assert message_group("order-1") == "order-1"


def test_a_message_the_client_cannot_encode_is_refused_not_taken_for_an_outage() -> None:
    # (an outage holds every row of the batch back: one bad row stopped all sending)
    from consumer_kit.core.errors import TransportError, TransportUnavailable
    from consumer_kit.transports.rocketmq5.wire import translate

    try:
        "caf\udce9".encode("utf-8")
    except UnicodeEncodeError as exc:
        translated = translate(exc, "sending message m1 to T")
    assert isinstance(translated, TransportError)
    assert not isinstance(translated, TransportUnavailable)


def test_the_brokers_own_properties_of_a_received_message_are_not_handed_to_the_handler() -> None:
    # Given a FIFO message: the proxy adds its message group as `__SHARDINGKEY`
    message = received(b"x", __SHARDINGKEY="K", ckit_id="M1", x="1")
    # When it is received
    delivery = received_delivery(message, reason="", max_reconsume_times=None)
    # Then the handler sees what the sender set, which can be sent again as it is
    assert dict(delivery.properties) == {"ckit_id": "M1", "x": "1"}


@pytest.mark.parametrize("await_seconds", [0.0, 1.0, 4.9, float("nan")])
def test_an_await_below_the_proxys_shortest_long_poll_is_refused_at_once(
        await_seconds: float) -> None:
    # Given an await the proxy raises to 5 s, whose request deadline can fall below that
    # When the transport is made, Then one line, before any receive fails with 40018
    with pytest.raises(ConfigError, match=r"await_seconds=\S+ is below the RocketMQ 5 proxy's "
                                          r"shortest long poll \(5 s\): use at least 5"):
        RocketMQ5Transport("rocketmq5://127.0.0.1:8081", await_seconds=await_seconds)


def test_an_await_of_the_proxys_shortest_long_poll_or_more_is_taken() -> None:
    assert RocketMQ5Transport("127.0.0.1:8081", await_seconds=5.0).await_seconds == 5.0
    assert RocketMQ5Transport("127.0.0.1:8081", await_seconds=20.0).await_seconds == 20.0


def test_a_dead_letters_keys_are_split_on_spaces_only() -> None:
    # Given a dead letter of a Java producer's message whose first key holds a tab
    delivery = stored_delivery("%DLQ%g", b"{}", {"KEYS": "order\t1001  cust-7"},
                               reconsume_times=3, queue_id=0, queue_offset=0,
                               born_timestamp_ms=1)
    # When its keys are read, Then the tab stays in its key and the doubled space makes no key
    assert sorted(delivery.keys.split(" ")) == ["cust-7", "order\t1001"]
