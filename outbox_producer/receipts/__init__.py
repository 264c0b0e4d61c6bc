"""Receipts on the producer side: applying consumer groups' answers to the outbox (`applier`)
and consuming the receipt topic (`consumer`). The wire format is `consumer_kit.core.receipt`."""

from __future__ import annotations

from consumer_kit.core.receipts_applier import ReceiptApplier, ReceiptResult
from outbox_producer.receipts.consumer import ReceiptConsumer

__all__ = ["ReceiptApplier", "ReceiptConsumer", "ReceiptResult"]
