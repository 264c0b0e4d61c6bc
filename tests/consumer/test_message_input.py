"""What a handler's `Message` makes of a foreign producer's input: KEYS split as RocketMQ splits
them (single spaces only), a junk `ckit_sent`, JSON Python cannot parse."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit import Message, Outcome
from consumer_kit.core.envelope import dedupe_id
from consumer_kit.transports import Delivery
from tests.consumer.conftest import Env, add_reservation, delivery

#: whitespace that is not RocketMQ's KEYS separator (" "): part of a key, as in Java
NOT_A_SEPARATOR = ["\t", "\x1f", "\u00a0", "\u3000", "\n", "\u2003"]


def foreign(keys: str, **properties: str) -> Delivery:
    """A message a Java producer sent: KEYS, no envelope."""
    return Delivery("ORDER_CREATED", b'{"sku": "A"}', "UNIQ-1", keys=keys,
                    properties=properties)


@pytest.mark.parametrize("space", NOT_A_SEPARATOR)
def test_whitespace_other_than_a_space_is_part_of_the_key_and_of_the_dedupe_id(
        space: str) -> None:
    # Given two foreign messages whose one key differs only after a tab, NBSP, \x1f...
    first, second = foreign(f"order{space}1001 cust-7"), foreign(f"order{space}1002 cust-7")
    # When their dedupe ids and keys are read
    ids = dedupe_id(first), dedupe_id(second)
    msg = Message.from_delivery(first)
    # Then each keeps its whole first key: two ids, not "order" twice
    assert ids == (f"order{space}1001", f"order{space}1002")
    assert (msg.id, msg.keys) == (f"order{space}1001", (f"order{space}1001", "cust-7"))


def test_doubled_leading_and_trailing_spaces_make_no_empty_keys() -> None:
    # Given KEYS with doubled, leading and trailing spaces (Java's split leaves "" entries)
    keys = "  order-1001   cust-7 "
    # When read as a message
    msg = Message.from_delivery(foreign(keys))
    # Then the empty entries are gone, the first real key is the id
    assert (msg.id, msg.keys) == ("order-1001", ("order-1001", "cust-7"))
    assert Message.from_delivery(foreign("   ")).id == "UNIQ-1"  # only spaces: no key


@pytest.mark.parametrize("space", ["\t", "\u00a0"])
def test_foreign_keys_that_differ_after_a_tab_or_nbsp_are_two_effects(
        env: Env, space: str) -> None:
    # Given a group consuming a Java producer's orders, keyed "order<space><n>"
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.json()["sku"])

    # When two different orders arrive
    outcomes = [app.pipeline().process(delivery(None, b'{"sku": "%s"}' % sku.encode(),
                                                keys=f"order{space}{n} cust-7", src=None))
                for n, sku in ((1001, "A"), (1002, "B"))]
    # Then both are applied, under their own ids (not the second acked as a duplicate)
    assert [o.outcome for o in outcomes] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
    assert env.effects() == {"A": 1, "B": 1}
    assert [m for m, _, _ in env.processed()] == [f"order{space}1001", f"order{space}1002"]


@pytest.mark.parametrize("junk", [
    "\u00b2", "\u0661\u0667\u0660\u0660", "\uff11\uff17\uff10\uff10", "1" * 5000, "-1", "17e11", "",
])
def test_a_junk_ckit_sent_reads_as_no_send_time_instead_of_raising(junk: str) -> None:
    # Given a foreign producer's ckit_sent that str.isdigit() may take but int() refuses (or
    # reads as digits that are not ASCII)
    msg = Message.from_delivery(foreign("order-1001", ckit_sent=junk))
    # When a handler reads the send time, Then it is None, as the property promises
    assert msg.sent_at_ms is None


def test_a_ckit_sent_of_ascii_digits_is_the_send_time() -> None:
    assert Message.from_delivery(foreign("k", ckit_sent="1700000000000")).sent_at_ms == (
        1700000000000)


@pytest.mark.parametrize(("body", "reason"), [
    (b"1" * 5000, "InvalidBody: body is JSON Python cannot parse: Exceeds the limit"),
    (b"[" * 5000 + b"]" * 5000, "InvalidBody: body is JSON nested too deep for Python"),
    (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "InvalidBody: body is JSON nested too deep"),
])
def test_json_python_cannot_parse_is_rejected_with_its_reason_not_retried(
        env: Env, body: bytes, reason: str) -> None:
    # Given a handler that parses the body, and valid JSON Python cannot parse (an integer over
    # its digit limit, nesting over its recursion limit)
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, str(msg.json()))

    # When it arrives
    outcome = app.pipeline().process(delivery("M1", body))
    # Then it is rejected at once with why (not retried until the dead letters), nothing applied
    assert outcome.outcome is Outcome.REJECTED
    [(mid, status, error)] = env.processed()
    assert (mid, status) == ("M1", "FAILED")
    assert error is not None and error.startswith(reason), error
    assert env.effects() == {}
