"""Rows of the SQL transport's message and dead-letter tables, read back as deliveries."""

from __future__ import annotations

from typing import Any

from consumer_kit.core.clock import to_epoch_ms
from consumer_kit.core.envelope import PROP_REASON
from consumer_kit.core.messages import Delivery


def row_delivery(row: Any, **fields: Any) -> Delivery:
    """A `Delivery` from a message or dead-letter row (`ckit_reason` becomes `last_error`);
    `fields` gives what the two tables do not hold the same way."""
    properties = dict(row.properties or {})
    return Delivery(
        body=bytes(row.body), broker_message_id=row.uniq_key, tags=row.tags or "",
        keys=row.keys or "", properties=properties,
        last_error=str(properties.pop(PROP_REASON, "") or ""), queue_id=int(row.queue_id),
        born_timestamp_ms=to_epoch_ms(row.born_at), **fields)
