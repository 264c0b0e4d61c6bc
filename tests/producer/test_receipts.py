"""Acks: per-group rows, CONSUMED when every expected group acked, REJECTED on a reject."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import ReceiptError
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
