"""`ckit_outbox_receipts{outcome}`: what it counts, as its help text says."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY

from consumer_kit.core.receipt import encode_receipts, receipt_topic
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.memory import MemoryTransport
from consumer_kit.transports.running import run_consumer
from outbox_producer import Receipt, ReceiptApplier, metrics
from outbox_producer.receipts.consumer import ReceiptConsumer
from tests.conftest import Db
from tests.producer.test_receipts import publish


def consumed() -> float:
    return REGISTRY.get_sample_value("ckit_outbox_receipts_total", {"outcome": "consumed"}) or 0


def test_the_receipts_counter_counts_outbox_rows_moved_and_its_help_says_so(
        sqlite_db: Db) -> None:
    # Given a message two groups must both consume
    [mid] = publish(sqlite_db)
    applier = ReceiptApplier(sqlite_db.engine, table=sqlite_db.names.outbox,
                             receipt_table_name=sqlite_db.names.receipts,
                             expected_groups={"T": ["a", "b"]})
    transport = MemoryTransport()
    worker = ReceiptConsumer(applier, transport, producer="orders")
    before = consumed()
    # When the first group's receipt arrives
    transport.send(OutgoingMessage(receipt_topic("orders"), encode_receipts([Receipt(mid, "a")])))
    run_consumer(worker.consumer(), threading.Event(), burst=True, max_seconds=30)
    # Then the counter has not moved: one receipt applied, no row CONSUMED yet
    assert consumed() == before
    # When the second one arrives, the row turns CONSUMED: the counter moves by one row
    transport.send(OutgoingMessage(receipt_topic("orders"), encode_receipts([Receipt(mid, "b")])))
    run_consumer(worker.consumer(), threading.Event(), burst=True, max_seconds=30)
    assert consumed() == before + 1
    # and its help says rows moved, not receipts applied (two were, for this one row)
    assert "rows" in metrics.RECEIPTS._documentation
    assert "Receipts applied" not in metrics.RECEIPTS._documentation


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("ckit_outbox_receipts_dropped_total",
                                     {"reason": reason}) or 0


def test_receipts_that_cannot_be_applied_are_counted_by_reason(sqlite_db: Db) -> None:
    # Given a receipt consumer of an outbox holding one message
    [mid] = publish(sqlite_db)
    applier = ReceiptApplier(sqlite_db.engine, table=sqlite_db.names.outbox,
                             receipt_table_name=sqlite_db.names.receipts)
    transport = MemoryTransport()
    worker = ReceiptConsumer(applier, transport, producer="orders")
    malformed, unknown = dropped("malformed"), dropped("unknown")
    # When an unreadable message, and a batch naming a message it does not hold, arrive
    topic = receipt_topic("orders")
    transport.send(OutgoingMessage(topic, b"not a receipt"))
    transport.send(OutgoingMessage(topic, encode_receipts(
        [Receipt(mid, "a"), Receipt("no-such-message", "a")])))
    run_consumer(worker.consumer(), threading.Event(), burst=True, max_seconds=30)
    # Then each is counted under its reason (they were logged and dropped before: no metric)
    assert dropped("malformed") == malformed + 1
    assert dropped("unknown") == unknown + 1
    assert worker.totals.consumed == 1
