"""The transport conformance suite, shipped so a transport of your own can run it.

Every backend of consumer-kit passes it (`tests/transports/test_conformance.py`). To run it on
yours, give pytest a fixture `h` returning a `Harness` (see `consumer_kit.testing.harness`) and
subclass the suite in a test module:

    from consumer_kit.testing import TransportConformance

    class TestMyTransport(TransportConformance):
        pass

It needs pytest (`pip install 'consumer-kit[dev]'`).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import pytest

from consumer_kit.core.errors import MessageTooLarge
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
    Verdict,
)
from consumer_kit.testing.harness import MAX_RECONSUME, Harness, wait_for
from consumer_kit.transports.base import Consumer


class Inbox:
    """Collects deliveries from a consumer callback; answers with `decide`."""

    def __init__(self, decide: Callable[[Delivery], ConsumeStatus | Verdict] | None = None
                 ) -> None:
        self.items: list[Delivery] = []
        self.lock = threading.Lock()
        self.decide = decide or (lambda _d: ConsumeStatus.CONSUME_SUCCESS)

    def __call__(self, delivery: Delivery) -> ConsumeStatus | Verdict:
        with self.lock:
            self.items.append(delivery)
        return self.decide(delivery)

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [d.body for d in self.items]


def start(h: Harness, group: str, topics: list[Subscription], inbox: Inbox) -> Consumer:
    consumer = h.transport.consumer(group, topics, inbox, threads=2)
    consumer.start()
    return consumer


class TransportConformance:
    """The behaviour every transport must have. Each test uses the `h` fixture."""

    def test_send_returns_a_broker_id_and_delivers_body_tags_keys_and_properties(
            self, h: Harness) -> None:
        # Given
        topic, group = h.topic("conf_props"), h.group("g_props")
        inbox = Inbox()
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            # When
            sent_properties = {"ckit_id": "01HX", "ckit_src": "orders", "x_custom": "1"}
            result = h.transport.send(OutgoingMessage(
                topic, b'{"order": 1}', tags="created", keys=("k-1", "k-2"),
                properties=sent_properties,
            ))
            # Then
            assert result.broker_message_id
            assert wait_for(lambda: len(inbox.items) == 1, h.timeout)
            got = inbox.items[0]
            assert got.body == b'{"order": 1}'
            assert got.topic == topic
            assert got.tags == "created"
            assert got.keys.split() == ["k-1", "k-2"]
            assert got.properties["ckit_id"] == "01HX"
            assert got.properties["ckit_src"] == "orders"
            # a property outside the envelope comes back too, and nothing of the transport's own
            assert dict(got.properties) == sent_properties
            assert got.broker_message_id
            assert got.reconsume_times == 0
        finally:
            consumer.shutdown()


    def test_binary_body_with_nul_bytes_round_trips(self, h: Harness) -> None:
        topic, group = h.topic("conf_bin"), h.group("g_bin")
        inbox = Inbox()
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            payload = bytes(range(256)) * 3
            h.transport.send(OutgoingMessage(topic, payload))
            assert wait_for(lambda: len(inbox.items) == 1, h.timeout)
            assert inbox.items[0].body == payload
        finally:
            consumer.shutdown()


    def test_every_group_gets_every_message(self, h: Harness) -> None:
        topic = h.topic("conf_groups")
        first, second = Inbox(), Inbox()
        consumers = [
            start(h, h.group("g_a"), [Subscription(topic)], first),
            start(h, h.group("g_b"), [Subscription(topic)], second),
        ]
        try:
            for i in range(5):
                h.transport.send(OutgoingMessage(topic, f"m{i}".encode()))
            assert wait_for(lambda: len(first.items) >= 5 and len(second.items) >= 5, h.timeout)
            expected = [f"m{i}".encode() for i in range(5)]
            assert sorted(first.bodies()) == sorted(second.bodies()) == expected
        finally:
            for c in consumers:
                c.shutdown()


    def test_two_consumers_of_one_group_share_the_messages_without_overlap(
            self, h: Harness) -> None:
        topic, group = h.topic("conf_share"), h.group("g_share")
        inbox = Inbox()
        consumers = [start(h, group, [Subscription(topic)], inbox) for _ in range(2)]
        try:
            balanced = getattr(h, "wait_balanced", None)  # transports that rebalance queues
            if balanced is not None:
                assert balanced(group, 2), "the broker never listed both consumers"
            for i in range(20):
                h.transport.send(OutgoingMessage(topic, f"s{i}".encode()))
            assert wait_for(lambda: len(inbox.items) >= 20, h.timeout)
            time.sleep(h.quiet)
            got = sorted(inbox.bodies())
            assert got == sorted(f"s{i}".encode() for i in range(20)), f"delivered: {got}"
        finally:
            for c in consumers:
                c.shutdown()


    def test_tag_expression_filters_deliveries(self, h: Harness) -> None:
        topic, group = h.topic("conf_tags"), h.group("g_tags")
        inbox = Inbox()
        consumer = start(h, group, [Subscription(topic, "A || B")], inbox)
        try:
            for tag in ("A", "C", "B", "C"):
                h.transport.send(OutgoingMessage(topic, tag.encode(), tags=tag))
            assert wait_for(lambda: len(inbox.items) >= 2, h.timeout)
            time.sleep(h.quiet)
            assert sorted(inbox.bodies()) == [b"A", b"B"]
        finally:
            consumer.shutdown()


    def test_one_consumer_routes_several_topics_to_one_callback(self, h: Harness) -> None:
        t1, t2, group = h.topic("conf_r1"), h.topic("conf_r2"), h.group("g_route")
        inbox = Inbox()
        consumer = start(h, group, [Subscription(t1), Subscription(t2)], inbox)
        try:
            h.transport.send(OutgoingMessage(t1, b"one"))
            h.transport.send(OutgoingMessage(t2, b"two"))
            assert wait_for(lambda: len(inbox.items) >= 2, h.timeout)
            assert {(d.topic, d.body) for d in inbox.items} == {(t1, b"one"), (t2, b"two")}
        finally:
            consumer.shutdown()


    def test_delayed_message_is_not_delivered_before_its_time(self, h: Harness) -> None:
        topic, group = h.topic("conf_delay"), h.group("g_delay")
        arrivals: list[float] = []

        def arrive(_d: Delivery) -> ConsumeStatus:
            arrivals.append(time.monotonic())
            return ConsumeStatus.CONSUME_SUCCESS

        inbox = Inbox(arrive)
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            sent_at = time.monotonic()
            h.transport.send(OutgoingMessage(topic, b"later", delay=1.0))
            assert wait_for(lambda: len(inbox.items) == 1, h.timeout + 2)
            assert arrivals[0] - sent_at >= 0.9
        finally:
            consumer.shutdown()


    def test_reconsume_later_redelivers_with_a_growing_reconsume_count(self, h: Harness) -> None:
        topic, group = h.topic("conf_retry"), h.group("g_retry")
        inbox = Inbox(lambda d: ConsumeStatus.RECONSUME_LATER if d.reconsume_times < 1
                      else ConsumeStatus.CONSUME_SUCCESS)
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            sent_properties = {"ckit_id": "R1", "x_custom": "r"}
            h.transport.send(OutgoingMessage(topic, b"again", properties=sent_properties))
            assert wait_for(lambda: len(inbox.items) >= 2, h.timeout)
            first, second = inbox.items[0], inbox.items[1]
            assert [first.reconsume_times, second.reconsume_times] == [0, 1]
            assert second.body == b"again"
            assert second.properties["ckit_id"] == "R1"
            assert dict(second.properties) == sent_properties
            assert second.topic == topic
            assert second.broker_message_id == first.broker_message_id
        finally:
            consumer.shutdown()


    def test_an_exception_in_the_callback_means_redelivery_not_loss(self, h: Harness) -> None:
        topic, group = h.topic("conf_raise"), h.group("g_raise")
        calls: list[int] = []

        def explode_once(d: Delivery) -> ConsumeStatus:
            calls.append(d.reconsume_times)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = start(h, group, [Subscription(topic)], Inbox(explode_once))
        try:
            h.transport.send(OutgoingMessage(topic, b"x"))
            assert wait_for(lambda: len(calls) >= 2, h.timeout)
        finally:
            consumer.shutdown()


    def test_message_goes_to_the_dead_letter_queue_after_max_reconsume_times(
            self, h: Harness) -> None:
        topic, group = h.topic("conf_dlq"), h.group("g_dlq")
        inbox = Inbox(lambda _d: ConsumeStatus.RECONSUME_LATER)
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            sent_properties = {"ckit_id": "P1", "x_custom": "p"}
            h.transport.send(OutgoingMessage(topic, b"poison", properties=sent_properties))
            dead = h.dead_letters(group, expect=1)
            assert [d.body for d in dead] == [b"poison"]
            assert dead[0].properties["ckit_id"] == "P1"
            assert dict(dead[0].properties) == sent_properties
            assert len(inbox.items) == MAX_RECONSUME + 1
        finally:
            consumer.shutdown()


    def test_a_busy_answer_comes_back_without_spending_a_reconsume(self, h: Harness) -> None:
        # Given: a callback answering "busy" (Verdict.spend False: not tried, another consumer
        # holds it) more often than the group's reconsume limit, then success
        topic, group = h.topic("conf_busy"), h.group("g_busy")
        busy_answers = MAX_RECONSUME + 2

        def decide(_d: Delivery) -> Verdict:
            if len(inbox.items) <= busy_answers:
                return Verdict(ConsumeStatus.RECONSUME_LATER, "busy", spend=False)
            return Verdict(ConsumeStatus.CONSUME_SUCCESS)

        inbox = Inbox(decide)
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            h.transport.send(OutgoingMessage(topic, b"held"))
            # Then: it comes back until acked, never counted as a reconsume, never dead
            assert wait_for(lambda: len(inbox.items) >= busy_answers + 1, h.timeout * 2)
            time.sleep(h.quiet)
            with inbox.lock:
                items = list(inbox.items)
            assert [(d.body, d.reconsume_times) for d in items] == \
                [(b"held", 0)] * (busy_answers + 1)
            assert h.dead_letters(group, expect=0) == []
        finally:
            consumer.shutdown()

    def test_a_failing_message_never_takes_healthy_messages_with_it(self, h: Harness) -> None:
        # Given: a callback for which "poison" always fails, "flaky-*" fails once, "ok-*" never
        topic, group = h.topic("conf_poison"), h.group("g_poison")
        acked: collections.Counter[bytes] = collections.Counter()
        lock = threading.Lock()

        def decide(d: Delivery) -> Verdict:
            if d.body == b"poison":
                return Verdict(ConsumeStatus.RECONSUME_LATER, "poison pill")
            if d.body.startswith(b"flaky") and d.reconsume_times == 0:
                return Verdict(ConsumeStatus.RECONSUME_LATER, f"{d.body.decode()} failed once")
            with lock:
                acked[d.body] += 1
            return Verdict(ConsumeStatus.CONSUME_SUCCESS)

        inbox = Inbox(decide)
        consumer = start(h, group, [Subscription(topic)], inbox)
        try:
            # When: the poison message is sent first, the healthy ones right behind it
            ok = [f"ok-{i}".encode() for i in range(8)]
            flaky = [f"flaky-{i}".encode() for i in range(4)]
            h.transport.send(OutgoingMessage(topic, b"poison"))
            for i, body in enumerate(ok):
                h.transport.send(OutgoingMessage(topic, body))
                if i % 2:
                    h.transport.send(OutgoingMessage(topic, flaky[i // 2]))
            dead = h.dead_letters(group, expect=1)
            assert wait_for(lambda: sum(acked.values()) >= len(ok) + len(flaky), h.timeout)
            time.sleep(h.quiet)
            # Then: every healthy message acked once; the "ok" ones at their first delivery
            assert acked == {body: 1 for body in ok + flaky}
            with inbox.lock:
                items = list(inbox.items)
            assert sorted((d.body, d.reconsume_times) for d in items if d.body in ok) == \
                [(body, 0) for body in sorted(ok)]
            assert {(d.body, d.last_error) for d in items
                    if d.body in flaky and d.reconsume_times} == \
                {(body, f"{body.decode()} failed once") for body in flaky}
            # only the poison message is dead, with its reason; each retry saw the last reason
            assert [(d.body, d.last_error) for d in dead] == [(b"poison", "poison pill")]
            assert [(d.reconsume_times, d.last_error) for d in items if d.body == b"poison"] \
                == [(0, "")] + [(n, "poison pill") for n in range(1, MAX_RECONSUME + 1)]
            assert {d.max_reconsume_times for d in items} == {MAX_RECONSUME}
            assert all("ckit_reason" not in d.properties for d in items + dead)
        finally:
            consumer.shutdown()

    def test_oversized_body_is_refused_before_sending(self, h: Harness) -> None:
        topic = h.topic("conf_big")
        with pytest.raises(MessageTooLarge):
            h.transport.send(OutgoingMessage(topic, b"x" * (h.transport.max_body_bytes + 1)))


    def test_a_restarted_consumer_resumes_after_the_committed_offset(self, h: Harness) -> None:
        topic, group = h.topic("conf_resume"), h.group("g_resume")
        first = Inbox()
        consumer = start(h, group, [Subscription(topic)], first)
        for i in range(3):
            h.transport.send(OutgoingMessage(topic, f"old{i}".encode()))
        assert wait_for(lambda: len(first.items) >= 3, h.timeout)
        committed = getattr(h, "wait_committed", None)  # transports that commit offsets later
        if committed is not None:
            assert committed(group, topic), "the consumed offsets never reached the broker"
        consumer.shutdown()

        for i in range(3):
            h.transport.send(OutgoingMessage(topic, f"new{i}".encode()))
        second = Inbox()
        consumer = start(h, group, [Subscription(topic)], second)
        try:
            assert wait_for(lambda: len(second.items) >= 3, h.timeout)
            time.sleep(h.quiet)
            got = sorted(second.bodies())
            assert got == [b"new0", b"new1", b"new2"], f"the restarted consumer got {got}"
        finally:
            consumer.shutdown()
