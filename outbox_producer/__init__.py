"""The producer half of consumer-kit: the transactional outbox (local message table).

Imports only `consumer_kit.core` and `consumer_kit.transports`: an upstream service that only
publishes loads no consumer module, no Redis client and no consumer metric.

>>> from outbox_producer import Outbox, Relay, Dispatcher, ReceiptApplier
"""

from __future__ import annotations

from consumer_kit.core.errors import OutboxError, PayloadError, PublishConflict
from consumer_kit.core.receipt import Receipt, ReceiptOutcome, receipt_topic
from consumer_kit.core.states import OutboxState
from outbox_producer.backoff import Backoff
from outbox_producer.claim import Shard
from outbox_producer.dispatcher import Dispatcher
from outbox_producer.outbox import Outbox
from outbox_producer.receipts import ReceiptApplier, ReceiptConsumer, ReceiptResult
from outbox_producer.relay import ClaimLost, Relay, RelayResult

__all__ = [
    "Backoff",
    "ClaimLost",
    "Dispatcher",
    "Outbox",
    "OutboxError",
    "OutboxState",
    "PayloadError",
    "PublishConflict",
    "Receipt",
    "ReceiptApplier",
    "ReceiptConsumer",
    "ReceiptOutcome",
    "ReceiptResult",
    "Relay",
    "RelayResult",
    "Shard",
    "receipt_topic",
]
