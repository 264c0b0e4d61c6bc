"""Acks: per-group rows, CONSUMED when every expected group acked, REJECTED on a reject."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError, ReceiptError
from consumer_kit.core.receipt import (
    ReceiptOutcome,
    decode_receipts,
    encode_receipts,
    receipt_topic,
)
from consumer_kit.core.states import OutboxState
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.memory import MemoryTransport
from consumer_kit.transports.running import run_consumer
from outbox_producer import Outbox, Receipt, ReceiptApplier, Relay
from outbox_producer.receipts.consumer import ReceiptConsumer
from tests.conftest import Db
from tests.recording import RecordingTransport


def publish(db: Db, n: int = 1, topic: str = "T") -> list[str]:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        return [outbox.publish(conn, topic, {"i": i}, biz_type="t", biz_key=f"{topic}{i}")
                for i in range(n)]


def state(db: Db, mid: str) -> tuple[int, str | None]:
    with db.engine.connect() as conn:
        r = conn.execute(sa.text(f"SELECT state, fail_reason FROM {db.names.outbox} "
                                 "WHERE message_id = :m"), {"m": mid}).one()
        return int(r[0]), r[1]


def applier(db: Db, **kwargs: object) -> ReceiptApplier:
    return ReceiptApplier(db.engine, table=db.names.outbox, receipt_table_name=db.names.receipts,
                      **kwargs)  # type: ignore[arg-type]


def test_an_ack_turns_a_sent_row_consumed(db: Db) -> None:
    [mid] = publish(db)
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    result = applier(db).apply([Receipt(mid, "inventory")])
    assert (result.recorded, result.consumed) == (1, 1)
    assert state(db, mid)[0] == OutboxState.CONSUMED
    assert db.count(db.names.receipts) == 1


def test_an_ack_that_arrives_before_the_row_is_marked_sent_still_ends_consumed(db: Db) -> None:
    # Given: the relay claimed the row (SENDING) and sent it, but has not marked it yet
    [mid] = publish(db)
    relay = Relay(db.engine, RecordingTransport(), table=db.names.outbox)
    rows = relay.claimer.claim(10)
    # When: the consumer's ack wins the race
    applier(db).apply([Receipt(mid, "inventory")])
    stats = relay.sender.send_rows(rows)
    # Then: the relay's late mark changes nothing
    assert stats.conflicts == 1
    assert state(db, mid)[0] == OutboxState.CONSUMED


def test_an_ack_for_a_pending_row_ends_consumed(db: Db) -> None:
    [mid] = publish(db)
    applier(db).apply([Receipt(mid, "inventory")])
    assert state(db, mid)[0] == OutboxState.CONSUMED
    transport = RecordingTransport()
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert transport.sent == []


def test_with_expected_groups_the_row_waits_for_every_group(db: Db) -> None:
    [mid] = publish(db, topic="ORDER_CREATED")
    acks = applier(db, expected_groups={"ORDER_CREATED": ["inventory", "billing"]})
    acks.apply([Receipt(mid, "inventory")])
    assert state(db, mid)[0] == OutboxState.PENDING
    acks.apply([Receipt(mid, "inventory")])  # a duplicate ack changes nothing
    assert db.count(db.names.receipts) == 1
    acks.apply([Receipt(mid, "billing")])
    assert state(db, mid)[0] == OutboxState.CONSUMED


def test_a_reject_from_a_group_makes_the_row_rejected_with_the_reason(db: Db) -> None:
    [mid] = publish(db)
    applier(db).apply([Receipt(mid, "inventory", ReceiptOutcome.REJECTED, "sku unknown")])
    st, reason = state(db, mid)
    assert st == OutboxState.REJECTED
    assert reason == "inventory: sku unknown"


def test_consumed_is_terminal_for_later_acks(db: Db) -> None:
    [mid] = publish(db)
    acks = applier(db)
    acks.apply([Receipt(mid, "inventory")])
    acks.apply([Receipt(mid, "billing", ReceiptOutcome.REJECTED, "late")])
    assert state(db, mid)[0] == OutboxState.CONSUMED


def test_acks_for_unknown_messages_are_counted_not_fatal(db: Db) -> None:
    result = applier(db).apply([Receipt("nope", "inventory")])
    assert result.unknown == 1


def test_a_batch_of_acks_is_applied_in_one_call(db: Db) -> None:
    ids = publish(db, 50)
    result = applier(db).apply([Receipt(m, "inventory") for m in ids])
    assert result.consumed == 50


def test_ack_messages_round_trip_and_malformed_ones_are_refused() -> None:
    acks = [Receipt("a", "g"), Receipt("b", "g", ReceiptOutcome.REJECTED, "bad")]
    assert decode_receipts(encode_receipts(acks)) == acks
    for body in (b"not json", b'{"id": 1}', b'[{"group": "g"}]', b'[{"id": "", "group": "g"}]'):
        with pytest.raises(ReceiptError):
            decode_receipts(body)


def test_the_ack_consumer_applies_ack_topic_messages_and_drops_malformed_ones(db: Db) -> None:
    import threading

    [mid] = publish(db)
    transport = MemoryTransport()
    transport.send(OutgoingMessage(receipt_topic("orders"), b"garbage"))
    body = encode_receipts([Receipt(mid, "inventory")])
    transport.send(OutgoingMessage(receipt_topic("orders"), body))
    worker = ReceiptConsumer(applier(db), transport, producer="orders")
    run_consumer(worker.consumer(), threading.Event(), burst=True, max_seconds=30)
    assert state(db, mid)[0] == OutboxState.CONSUMED
    assert worker.malformed == 1


def test_a_row_whose_receipt_beat_its_mark_is_re_sent_as_a_resend_after_a_forced_retry(
        db: Db) -> None:
    # Given: the consumer's receipt arrived before the relay marked the row SENT, so the row
    # went SENDING -> CONSUMED without the relay's mark (seen in the long fault run)
    from consumer_kit.core.envelope import PROP_RESEND, to_message
    from outbox_producer import ops

    [mid] = publish(db)
    relay = Relay(db.engine, RecordingTransport(), table=db.names.outbox)
    rows = relay.claimer.claim(10)
    applier(db).apply([Receipt(mid, "inventory")])
    assert relay.sender.send_rows(rows).conflicts == 1
    # When: an operator re-sends it (`ckit outbox retry --force`, a duplicate storm)
    assert ops.retry(db.engine, ops.OutboxTables.from_names(db.names), [mid], force=True).changed
    [again] = relay.claimer.claim(10)
    # Then: the re-send says so, and a group that processed it answers with a receipt again
    # (a plain duplicate would send none, and the row would wait for the reconciler)
    assert again.sent_before
    assert to_message(again).properties[PROP_RESEND] == "1"


@dataclasses.dataclass
class Retried:
    """A row its group rejected, then `ckit outbox retry`: PENDING again, while the group's
    rejected receipt for the first delivery (`old`) is still on its way (owed, redelivered)."""

    message_id: str
    relay: Relay
    acks: ReceiptApplier
    old: Receipt


def rejected_then_retried(db: Db) -> Retried:
    from outbox_producer import ops

    [mid] = publish(db)
    relay = Relay(db.engine, RecordingTransport(), table=db.names.outbox)
    relay.run_once()
    old = Receipt(mid, "inventory", ReceiptOutcome.REJECTED, "price service said no")
    acks = applier(db)
    acks.apply([old])
    assert ops.retry(db.engine, ops.OutboxTables.from_names(db.names), [mid]).changed
    return Retried(mid, relay, acks, old)


def test_an_old_rejection_arriving_after_an_operators_retry_leaves_the_re_send_to_decide(
        db: Db) -> None:
    row = rejected_then_retried(db)
    # When the old rejection arrives again
    row.acks.apply([row.old])
    # Then the re-send still goes out (the row is not rejected again before it)
    assert state(db, row.message_id)[0] == OutboxState.PENDING
    row.relay.run_once()
    assert state(db, row.message_id)[0] == OutboxState.SENT
    # and the group's answer to the re-send decides: it ran it and consumed it
    row.acks.apply([Receipt(row.message_id, "inventory")])
    assert state(db, row.message_id)[0] == OutboxState.CONSUMED


def test_an_old_rejection_arriving_once_the_re_send_is_out_rejects_only_until_its_answer(
        db: Db) -> None:
    row = rejected_then_retried(db)
    row.relay.run_once()  # the re-send is out (SENT again)
    # When the old rejection arrives now, Then it rejects the row (it cannot tell which
    # delivery it answers)
    row.acks.apply([row.old])
    assert state(db, row.message_id)[0] == OutboxState.REJECTED
    # until the group's answer to the re-send (which re-runs a failed message) arrives
    row.acks.apply([Receipt(row.message_id, "inventory")])
    assert state(db, row.message_id)[0] == OutboxState.CONSUMED


def test_a_group_that_rejected_a_message_and_consumed_a_later_delivery_makes_it_consumed(
        db: Db) -> None:
    # Given a row REJECTED by the one group expected for its topic
    [mid] = publish(db, topic="ORDER")
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    acks = applier(db, expected_groups={"ORDER": ["inventory", "billing"]})
    acks.apply([Receipt(mid, "billing"),
                Receipt(mid, "inventory", ReceiptOutcome.REJECTED, "no stock")])
    assert state(db, mid)[0] == OutboxState.REJECTED
    # When that group ran a later delivery of it (a re-send re-runs a failed message)
    result = acks.apply([Receipt(mid, "inventory")])
    # Then its success replaces its rejection, and every expected group consumed the message
    assert state(db, mid)[0] == OutboxState.CONSUMED
    assert result.consumed == 1
    with db.engine.connect() as conn:
        outcomes = {str(group): str(outcome) for group, outcome in conn.execute(sa.text(
            f"SELECT consumer_group, outcome FROM {db.names.receipts} WHERE message_id = :m"),
            {"m": mid})}
    assert outcomes == {"inventory": "consumed", "billing": "consumed"}


def test_receipts_applied_again_are_not_counted_as_recorded_on_any_database(db: Db) -> None:
    # Given two groups' receipts of a message, applied once
    [mid] = publish(db, topic="ORDER")
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    acks = applier(db, expected_groups={"ORDER": ["inventory", "billing"]})
    first = acks.apply([Receipt(mid, "inventory"),
                        Receipt(mid, "billing", ReceiptOutcome.REJECTED, "no stock")])
    # When the same receipts come again, then billing's consumed one replaces its rejection
    again = acks.apply([Receipt(mid, "inventory"),
                        Receipt(mid, "billing", ReceiptOutcome.REJECTED, "no stock")])
    replaced = acks.apply([Receipt(mid, "inventory"), Receipt(mid, "billing")])
    # Then only real changes count: 2 rows, none, the one replaced (MariaDB counted a found
    # duplicate as a row: 2 and 3)
    assert (first.recorded, again.recorded, replaced.recorded) == (2, 0, 1)
    assert db.count(db.names.receipts) == 2
    assert state(db, mid)[0] == OutboxState.CONSUMED


def test_a_rejection_from_a_group_not_expected_for_the_topic_does_not_reject_the_row(
        db: Db) -> None:
    # Given the topic's expected group, and another subscriber of it
    [mid] = publish(db, topic="ORDER")
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    acks = applier(db, expected_groups={"ORDER": ["inventory"]})
    # When the other one rejects it and the expected one consumes it
    acks.apply([Receipt(mid, "analytics", ReceiptOutcome.REJECTED, "schema v2 only")])
    assert state(db, mid)[0] == OutboxState.SENT
    acks.apply([Receipt(mid, "inventory")])
    # Then the row is CONSUMED, as the reconciler decides on the same evidence
    assert state(db, mid)[0] == OutboxState.CONSUMED


def test_receipts_for_ids_the_outbox_does_not_hold_are_named_in_the_log(
        db: Db, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        result = applier(db).apply([Receipt("payments-msg-1", "inventory")])
    assert result.unknown == 1
    assert "payments-msg-1" in caplog.text


def test_one_bad_entry_of_a_receipt_message_is_dropped_alone_and_the_rest_applied(
        db: Db) -> None:
    import json
    import threading

    # Given a receipt message whose batch holds a valid receipt and entries that are not ones
    ids = publish(db, 2)
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    body = json.dumps([
        {"id": ids[0], "group": "inventory", "outcome": "consumed"},
        {"id": ids[1], "group": "inventory", "outcome": "rejected", "reason": 42},
        {"id": None, "group": "inventory"},
        {"id": "x" * 500, "group": "inventory"},
    ]).encode()
    transport = MemoryTransport()
    transport.send(OutgoingMessage(receipt_topic("orders"), body))
    worker = ReceiptConsumer(applier(db), transport, producer="orders")
    # When it is consumed
    run_consumer(worker.consumer(), threading.Event(), burst=True, max_seconds=30)
    # Then the valid receipt is applied, and each bad entry counted as malformed, none applied
    assert state(db, ids[0])[0] == OutboxState.CONSUMED
    assert state(db, ids[1])[0] == OutboxState.SENT
    assert worker.malformed == 3


def test_a_topic_given_twice_to_expect_waits_for_the_groups_of_both(db: Db) -> None:
    from consumer_kit.cli.receipts import expected_groups

    # Given `--expect ORDER=inventory --expect ORDER=billing`
    expected = expected_groups(["ORDER=inventory", "ORDER=billing,inventory"])
    assert expected == {"ORDER": ["inventory", "billing"]}
    # When only billing consumed the message, Then it is not CONSUMED yet
    [mid] = publish(db, topic="ORDER")
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    acks = applier(db, expected_groups=expected)
    acks.apply([Receipt(mid, "billing")])
    assert state(db, mid)[0] == OutboxState.SENT
    acks.apply([Receipt(mid, "inventory")])
    assert state(db, mid)[0] == OutboxState.CONSUMED


@pytest.mark.parametrize("groups", ["inventory", ["inventory", 7], [""]])
def test_expected_groups_given_as_one_string_or_with_a_non_group_are_refused(
        sqlite_db: Db, groups: object) -> None:
    # A string is a Sequence[str] of its letters: {"ORDER": "inventory"} waited for groups
    # "i", "n", "v", ..., so the row never turned CONSUMED, and a rejection by inventory, not
    # one of those letters, was ignored: the row stayed SENT whatever the groups answered
    with pytest.raises(ConfigError, match="ORDER"):
        applier(sqlite_db, expected_groups={"ORDER": groups})


def test_expected_groups_given_as_a_tuple_or_a_set_wait_for_those_groups(sqlite_db: Db) -> None:
    db = sqlite_db
    [mid] = publish(db, topic="ORDER")
    acks = applier(db, expected_groups={"ORDER": ("inventory",), "OTHER": {"billing"}})
    acks.apply([Receipt(mid, "inventory")])
    assert state(db, mid)[0] == OutboxState.CONSUMED
