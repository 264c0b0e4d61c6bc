"""RocketMQ transport pieces that need no broker: delay levels, body encoding, addresses, and
the one-line error when librocketmq is missing."""

from __future__ import annotations

import base64
import sys

import pytest

from consumer_kit.core.errors import ConfigError
from consumer_kit.transports.base import DEFAULT_DELAY_LEVELS, DEFAULT_RETRY_DELAYS
from consumer_kit.transports.rocketmq import native as rocketmq_native
from consumer_kit.transports.rocketmq.wire import (
    delay_level,
    encode_body,
    make_delivery,
    parse_addr,
    read_properties,
)

LEVELS = (1, 5, 10, 30, 60)


@pytest.mark.parametrize(("seconds", "level"), [
    (0, 0), (-3, 0), (0.5, 1), (1, 1), (2, 2), (10, 3), (11, 4), (60, 5), (3600, 5),
])
def test_a_delay_maps_to_the_first_level_at_or_above_it(seconds: float, level: int) -> None:
    assert delay_level(seconds, LEVELS) == level


@pytest.mark.parametrize("body", [b"", b"plain", "caf\u00e9".encode(), b"a\x00b", b"\xff\xfe",
                                  bytes(range(256))])
def test_bodies_the_cpp_client_would_truncate_are_base64_and_the_rest_untouched(
    body: bytes,
) -> None:
    wire, encoded = encode_body(body)
    unsafe = b"\x00" in body or not _is_utf8(body)
    assert encoded is unsafe
    assert (base64.b64decode(wire) if encoded else wire) == body
    assert b"\x00" not in wire


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_received_properties_are_the_envelope_the_listed_names_and_the_extra_ones() -> None:
    # Given what a received message answers by name (it cannot list its properties)
    stored = {"ckit_id": "01HX", "ckit_props": "x_custom,x_empty", "x_custom": "1",
              "ckit_enc": "b64", "x_extra": "e", "x_unlisted": "u", "UNIQ_KEY": "K"}
    # When
    found = read_properties(lambda name: stored.get(name, ""), ["x_extra"])
    # Then empty and unlisted ones are left out
    assert found == {"ckit_id": "01HX", "x_custom": "1", "ckit_enc": "b64", "x_extra": "e"}
    # and the delivery drops the transport's own, decoding the body they describe
    delivery = make_delivery(topic="t", body=base64.b64encode(b"\x00"), broker_message_id="K",
                             properties=dict(found))
    assert dict(delivery.properties) == {"ckit_id": "01HX", "x_custom": "1", "x_extra": "e"}
    assert delivery.body == b"\x00"


def test_the_retry_back_off_is_rocketmqs_delay_levels_from_the_third_on() -> None:
    assert [delay_level(s) - 2 for s in DEFAULT_RETRY_DELAYS] == list(
        range(1, len(DEFAULT_RETRY_DELAYS) + 1))
    assert DEFAULT_DELAY_LEVELS[2:] == DEFAULT_RETRY_DELAYS


def test_name_server_addresses_are_validated() -> None:
    assert parse_addr("127.0.0.1:9876/") == "127.0.0.1:9876"
    assert parse_addr("a:1; b:2") == "a:1;b:2"
    with pytest.raises(ConfigError, match="bad RocketMQ name-server address"):
        parse_addr("localhost")


def test_a_missing_librocketmq_is_one_line_that_says_what_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given: the package import fails the way 2.0.0 does without its native library
    monkeypatch.setitem(sys.modules, "rocketmq", None)  # makes `from rocketmq import ...` fail
    rocketmq_native.client.cache_clear()
    try:
        # When / Then
        with pytest.raises(ConfigError) as caught:
            rocketmq_native.client()
    finally:
        rocketmq_native.client.cache_clear()
    message = str(caught.value)
    assert "scripts/librocketmq.sh" in message
    assert "\n" not in message


@pytest.mark.parametrize("name", ["TTL", "CORRELATION_ID", "MSG_TYPE", "REPLY_TO_CLIENT",
                                  "TRAN_PREPARED_QUEUE_OFFSET", "ckit_enc", "ckit_props"])
def test_every_property_rocketmq_sets_itself_is_refused_as_a_user_property(name: str) -> None:
    from consumer_kit.core.errors import TransportError
    from consumer_kit.transports.rocketmq.wire import check_property

    with pytest.raises(TransportError, match="reserved"):
        check_property(name, "x")


def test_an_empty_body_is_refused_before_sending_as_a_message_retrying_cannot_help() -> None:
    from consumer_kit.core.errors import EmptyBody, MessageRefused
    from consumer_kit.core.messages import OutgoingMessage
    from consumer_kit.transports.rocketmq import RocketMQTransport

    transport = RocketMQTransport("127.0.0.1:1")  # never reached: refused before any I/O
    with pytest.raises(EmptyBody) as exc:
        transport.send(OutgoingMessage("T", b""))
    assert isinstance(exc.value, MessageRefused)


@pytest.mark.parametrize("body", [b"", b"a", b"head\x00tail\x00", b"\x00" * 7,
                                  bytes(range(256)) * 300])
def test_the_whole_body_of_a_native_message_is_read_past_its_nul_bytes(body: bytes) -> None:
    # Given a message of the C library holding the body (as a received one does)
    library = rocketmq_native.dll()
    message = library.CreateMessage(b"T")
    try:
        library.SetByteMessageBody(message, body, len(body))
        # When its body is read, Then it is all of it (the C string ends at the first NUL)
        assert rocketmq_native.body(message) == body
    finally:
        library.DestroyMessage(message)
    rocketmq_native.check_body_layout()  # and the check a consumer runs at start passes


@pytest.mark.parametrize("marked", [b"not base64!", b"YQ=", b"\x00\x01"])
def test_a_body_marked_base64_that_is_not_is_an_error_not_a_different_body(
        marked: bytes) -> None:
    with pytest.raises(ValueError, match="not base64"):
        make_delivery(topic="t", body=marked, broker_message_id="K",
                      properties={"ckit_enc": "b64"})
    # read back from the store (a dead letter) it is shown as stored, marked
    stored = make_delivery(topic="t", body=marked, broker_message_id="K",
                           properties={"ckit_enc": "b64", "ckit_props": "x", "x": "1"},
                           stored=True)
    assert (stored.body, dict(stored.properties)) == (
        marked, {"ckit_enc": "b64", "ckit_props": "x", "x": "1"})
