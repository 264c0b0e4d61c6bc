"""The RocketMQ send-back decisions that need no broker: which copy is made, where it goes, how
the stored message is found on a cluster of several brokers, and the stored-message codec.
(The real broker is in tests/integration/test_rocketmq_poison.py and the conformance suite.)"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import pytest

from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import Delivery
from consumer_kit.transports.base import REASON_MAX_CHARS, clip_reason
from consumer_kit.transports.rocketmq.codec import (
    StoredMessage,
    decode_message,
    encode_properties,
)
from consumer_kit.transports.rocketmq.sendback import SendBack, is_the_delivery, plan_copy
from consumer_kit.transports.rocketmq.wire import make_delivery

GROUP = "inventory"


def stored(*, topic: str = "ORDERS", props: dict[str, str] | None = None, queue: int = 1,
           offset: int = 7, reconsume: int = 0, commit_log_offset: int = 4096) -> StoredMessage:
    return StoredMessage(topic, b'{"n": 1}', {"UNIQ_KEY": "U1"} if props is None else props,
                         queue, offset, reconsume, 1000, 1001,
                         commit_log_offset=commit_log_offset, offset_msg_id="7F000001OFFSETID")


def delivery(*, reconsume: int = 0, msg_id: str = "U1") -> Delivery:
    return Delivery("ORDERS", b'{"n": 1}', msg_id, queue_id=1, queue_offset=7,
                    reconsume_times=reconsume)


@pytest.mark.parametrize(("reconsume", "limit", "levels", "dead", "level"), [
    (0, 2, 18, False, 3), (1, 2, 18, False, 4), (2, 2, 18, True, 0), (5, 2, 18, True, 0),
    (15, 16, 18, False, 18), (14, 16, 6, False, 6), (0, 0, 18, True, 0),
])
def test_a_copy_goes_to_the_retry_topic_at_level_3_plus_count_until_the_limit_then_the_dlq(
    reconsume: int, limit: int, levels: int, dead: bool, level: int
) -> None:
    # When
    copy = plan_copy(stored(reconsume=reconsume), delivery(reconsume=reconsume), limit=limit,
                     levels=levels, reason="boom")
    # Then: the count always grows by one, the delay level is capped at the broker's last
    assert (copy.dead, copy.delay_level, copy.reconsume_times) == (dead, level, reconsume + 1)
    assert copy.properties.get("DELAY") == (str(level) if level else None)
    # and the broker's own DLQ check (new count >= maxReconsumeTimes) agrees with ours
    assert (copy.reconsume_times >= copy.max_reconsume_times) is dead


@pytest.mark.parametrize("reconsume,limit", [(0, 2), (2, 2), (5, 2), (0, 0)])
def test_a_busy_copy_keeps_its_count_and_is_never_a_dead_letter(reconsume: int,
                                                                 limit: int) -> None:
    # When: the message was answered busy (not tried), even past the group's limit
    copy = plan_copy(stored(reconsume=reconsume), delivery(reconsume=reconsume), limit=limit,
                     levels=18, reason="busy", spend=False)
    # Then: back to the retry topic with the same count; the broker's DLQ check agrees
    assert (copy.dead, copy.reconsume_times, copy.delay_level) == (False, reconsume,
                                                                    3 + reconsume)
    assert copy.reconsume_times < copy.max_reconsume_times


def test_a_copy_keeps_every_stored_property_and_the_id_and_says_why() -> None:
    # Given: a foreign message already retried once (the broker added its bookkeeping)
    props = {"UNIQ_KEY": "U1", "KEYS": "order-1", "TAGS": "created", "x_trace": "abc",
             "RETRY_TOPIC": "ORDERS", "ORIGIN_MESSAGE_ID": "FIRST", "REAL_TOPIC": "%RETRY%g",
             "REAL_QID": "0", "DELAY": "3", "CLUSTER": "DefaultCluster", "ckit_reason": "old",
             "TRAN_MSG": "true"}
    # When
    copy = plan_copy(stored(props=props, reconsume=1), delivery(reconsume=1), limit=16,
                     levels=18, reason="stock \x00service\x01 down")
    # Then
    assert copy.properties == {
        "UNIQ_KEY": "U1", "KEYS": "order-1", "TAGS": "created", "x_trace": "abc",
        "RETRY_TOPIC": "ORDERS", "ORIGIN_MESSAGE_ID": "FIRST", "DELAY": "4",
        "ckit_reason": "stock service down",
    }


def test_a_first_copy_gets_the_retry_topic_origin_id_and_a_unique_key_when_it_had_none() -> None:
    # Given: a message stored without UNIQ_KEY (the consumer saw the client's offset id)
    copy = plan_copy(stored(props={"x": "1"}), delivery(msg_id="0100007F00002A9F0000000000001000"),
                     limit=2, levels=18, reason="")
    # Then: the next delivery has the same id, so the dedupe key stays stable
    assert copy.properties == {"x": "1", "RETRY_TOPIC": "ORDERS",
                               "ORIGIN_MESSAGE_ID": "7F000001OFFSETID",
                               "UNIQ_KEY": "0100007F00002A9F0000000000001000", "DELAY": "3"}


def test_a_long_reason_is_cut_and_an_empty_one_is_not_sent() -> None:
    assert len(clip_reason("x" * 5000)) == REASON_MAX_CHARS
    assert "ckit_reason" not in plan_copy(stored(), delivery(), limit=2, levels=18,
                                          reason=" \x00 ").properties


@pytest.mark.parametrize(("change", "matches"), [
    ({}, True),
    ({"topic": "%RETRY%inventory"}, True),
    ({"topic": "OTHER"}, False),
    ({"queue": 2}, False),
    ({"offset": 8}, False),
    ({"props": {"UNIQ_KEY": "U2"}}, False),
    ({"props": {}, "commit_log_offset": 0x1000}, False),  # no UNIQ_KEY: the offset must match
])
def test_only_the_delivered_message_is_taken_for_it(change: dict[str, Any], matches: bool
                                                    ) -> None:
    assert is_the_delivery(stored(**change), delivery(), GROUP) is matches


def test_a_message_without_unique_key_is_matched_by_its_offset() -> None:
    s = stored(props={}, commit_log_offset=0x1000)
    assert is_the_delivery(s, delivery(msg_id="0100007F00002A9F0000000000001000"), GROUP)


class FakeAdmin:
    """Masters with commit logs (`{address: {offset: message}}`) and a record of sends."""

    def __init__(self, logs: dict[str, dict[int, StoredMessage]], *, down: set[str] = frozenset(),
                 retry_max_times: int = 2) -> None:
        self.logs = logs
        self.down = set(down)
        self.retry_max_times = retry_max_times
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def master_brokers(self) -> dict[str, str]:
        return {f"broker-{i}": addr for i, addr in enumerate(self.logs)}

    def view_message(self, addr: str, offset: int) -> StoredMessage | None:
        if addr in self.down:
            raise TransportUnavailable(f"{addr} down")
        return self.logs[addr].get(offset)

    def subscription_groups(self, addr: str) -> dict[str, dict[str, Any]]:
        return {GROUP: {"retryMaxTimes": self.retry_max_times}}

    def broker_config(self, addr: str) -> dict[str, str]:
        return {"messageDelayLevel": "1s 5s 10s 30s"}

    def send_message(self, addr: str, **fields: Any) -> dict[str, str]:
        if addr in self.down:
            raise TransportUnavailable(f"{addr} down")
        self.sent.append((addr, fields))
        return {}


def send_back(admin: FakeAdmin, d: Delivery, offset: int = 4096, patience: float = 0.0
              ) -> Any:
    return SendBack(admin, GROUP, patience=patience).send_back(d, offset, "boom")  # type: ignore[arg-type]


def test_the_copy_is_made_on_the_broker_that_stores_the_message() -> None:
    # Given: two brokers with something at the same commit log offset, only one of it ours
    other = stored(props={"UNIQ_KEY": "SOMEONE-ELSE"})
    admin = FakeAdmin({"b0:10911": {4096: other}, "b1:10911": {4096: stored()}})
    # When
    sent = send_back(admin, delivery())
    # Then
    assert (sent.broker, sent.topic, sent.reconsume_times, sent.delay_level) == \
        ("b1:10911", "%RETRY%inventory", 1, 3)
    [(addr, fields)] = admin.sent
    assert addr == "b1:10911"
    assert (fields["topic"], fields["reconsume_times"], fields["max_reconsume_times"]) == \
        ("%RETRY%inventory", 1, 3)
    assert fields["properties"]["ckit_reason"] == "boom"


def test_a_spent_message_is_sent_to_the_dlq_through_the_retry_topic_without_a_delay() -> None:
    admin = FakeAdmin({"b0:10911": {4096: stored(reconsume=2)}})
    sent = send_back(admin, delivery(reconsume=2))
    assert (sent.topic, sent.delay_level, sent.reconsume_times) == ("%DLQ%inventory", 0, 3)
    [(_addr, fields)] = admin.sent
    assert "DELAY" not in fields["properties"]
    assert fields["reconsume_times"] >= fields["max_reconsume_times"]  # the broker's DLQ rule


def test_no_copy_when_the_message_matches_on_several_brokers() -> None:
    admin = FakeAdmin({"b0:10911": {4096: stored()}, "b1:10911": {4096: stored()}})
    with pytest.raises(TransportError, match="matches on 2 brokers"):
        send_back(admin, delivery())
    assert admin.sent == []


def test_no_copy_when_no_broker_stores_it() -> None:
    admin = FakeAdmin({"b0:10911": {4096: stored(offset=99)}})
    with pytest.raises(TransportError, match="not found"):
        send_back(admin, delivery())


def test_an_unreachable_broker_is_retried_then_reported_as_unavailable() -> None:
    admin = FakeAdmin({"b0:10911": {4096: stored()}}, down={"b0:10911"})
    with pytest.raises(TransportUnavailable):
        send_back(admin, delivery(), patience=0.3)
    assert admin.sent == []


def test_a_match_on_a_live_broker_is_enough_when_another_is_down() -> None:
    admin = FakeAdmin({"b0:10911": {}, "b1:10911": {4096: stored()}}, down={"b0:10911"})
    assert send_back(admin, delivery()).broker == "b1:10911"


def test_the_group_limit_is_read_from_the_broker_for_each_delivery() -> None:
    sender = SendBack(FakeAdmin({"b0:10911": {}}, retry_max_times=5), GROUP)  # type: ignore[arg-type]
    assert sender.limit() == 5


def test_a_stored_message_decodes_with_its_place_and_all_properties() -> None:
    # Given: the bytes of a stored message (MessageDecoder's layout, IPv4 hosts)
    props = encode_properties({"UNIQ_KEY": "U1", "x_trace": "abc"}).encode()
    body, topic = b'{"n": 1}', b"ORDERS"
    head = struct.pack(">iIiiiqqiq", 0, 0xDAA320A7, 0, 3, 5, 42, 4096, 0, 1000)
    hosts = bytes([10, 0, 0, 1]) + struct.pack(">i", 5555) + struct.pack(">q", 1001) \
        + bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
    rest = struct.pack(">iqi", 2, 0, len(body)) + body + bytes([len(topic)]) + topic \
        + struct.pack(">h", len(props)) + props
    raw = head + hosts + rest
    raw = struct.pack(">i", len(raw)) + raw[4:]
    # When
    m = decode_message(raw)
    # Then
    assert (m.topic, m.body, m.queue_id, m.queue_offset, m.flag, m.reconsume_times) == \
        ("ORDERS", body, 3, 42, 5, 2)
    assert (m.commit_log_offset, m.store_host, m.offset_msg_id) == \
        (4096, "127.0.0.1:10911", "7F00000100002A9F0000000000001000")
    assert m.properties == {"UNIQ_KEY": "U1", "x_trace": "abc"}


def test_the_reason_property_arrives_as_last_error_not_as_a_property() -> None:
    d = make_delivery(body=b"x", properties={"ckit_reason": "why", "ckit_id": "1"}, topic="T",
                      broker_message_id="U")
    assert (d.last_error, dict(d.properties)) == ("why", {"ckit_id": "1"})


def test_a_consumer_keeps_sending_back_until_the_broker_answers_instead_of_giving_up() -> None:
    # Given a broker that is unreachable for 0.6 s, longer than the patience
    admin = FakeAdmin({"b0:10911": {4096: stored()}}, down={"b0:10911"})
    threading.Timer(0.6, admin.down.clear).start()
    # When a consumer that is not stopping sends a failed message back
    sent = SendBack(admin, GROUP, patience=0.1).send_back(  # type: ignore[arg-type]
        delivery(), 4096, "boom", until=lambda: False)
    # Then the copy was stored once the broker answered (falling back to the native send-back
    # would meet the same unreachable broker, and librocketmq drops what it fails to send back)
    assert sent.topic == f"%RETRY%{GROUP}" and len(admin.sent) == 1


def test_a_stopping_consumer_stops_sending_back_to_an_unreachable_broker() -> None:
    admin = FakeAdmin({"b0:10911": {4096: stored()}}, down={"b0:10911"})
    stopping = threading.Event()
    threading.Timer(0.3, stopping.set).start()
    began = time.monotonic()
    with pytest.raises(TransportUnavailable):
        SendBack(admin, GROUP, patience=30).send_back(  # type: ignore[arg-type]
            delivery(), 4096, "boom", until=stopping.is_set)
    assert time.monotonic() - began < 5 and admin.sent == []


def test_a_group_limit_the_broker_answers_unreadably_keeps_the_last_known_one() -> None:
    class Garbled(FakeAdmin):
        def subscription_groups(self, addr: str) -> dict[str, dict[str, Any]]:
            raise ValueError("Expecting value: line 1 column 1 (char 0)")

    # (a broker reply that is no JSON must not make every delivery fail before its handler)
    assert SendBack(Garbled({"b0:10911": {}}), GROUP).limit() is None  # type: ignore[arg-type]


def test_a_verdict_holding_a_bare_int_is_read_as_its_status() -> None:
    from consumer_kit.core.messages import ConsumeStatus, Verdict, as_verdict

    # (transports compare with `is`: Verdict(0) was taken for a failure and sent back after
    # its handler succeeded)
    assert as_verdict(Verdict(0, "ok")).status is ConsumeStatus.CONSUME_SUCCESS  # type: ignore[arg-type]
    assert as_verdict(Verdict(1, "later")) == Verdict(ConsumeStatus.RECONSUME_LATER, "later")  # type: ignore[arg-type]
