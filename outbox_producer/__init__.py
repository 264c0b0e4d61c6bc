"""The producer half of consumer-kit: the transactional outbox (local message table).

>>> from outbox_producer import Outbox, Relay, Dispatcher, AckApplier, Ack
"""

from __future__ import annotations

from consumer_kit.schema import AckOutcome, OutboxState
from outbox_producer.acks import Ack, AckApplier, AckResult, ack_topic, decode_acks, encode_acks
from outbox_producer.backoff import Backoff
from outbox_producer.claim import Shard
from outbox_producer.dispatcher import Dispatcher
from outbox_producer.errors import AckError, BrokerUnavailable, OutboxError, PayloadError
from outbox_producer.outbox import Outbox
from outbox_producer.relay import Relay, RelayResult

__all__ = [
    "Ack",
    "AckApplier",
    "AckError",
    "AckOutcome",
    "AckResult",
    "Backoff",
    "BrokerUnavailable",
    "Dispatcher",
    "Outbox",
    "OutboxError",
    "OutboxState",
    "PayloadError",
    "Relay",
    "RelayResult",
    "Shard",
    "ack_topic",
    "decode_acks",
    "encode_acks",
]
