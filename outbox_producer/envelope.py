"""Building the message the broker sees from an outbox row (DESIGN.md, "The envelope")."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from consumer_kit.clock import to_epoch_ms
from consumer_kit.transports.base import (
    PROP_BIZ,
    PROP_ENC,
    PROP_ID,
    PROP_SENT,
    PROP_SRC,
    OutgoingMessage,
)


def envelope(row: Mapping[str, Any]) -> OutgoingMessage:
    """Return the `OutgoingMessage` for an outbox row.

    `ckit_id` is the message id, also the first KEYS entry so operators can query the broker by
    it; `ckit_src` is the row's `created_by` (the producer that published it, where acks go);
    user headers go first so they can never overwrite the envelope properties.
    """
    headers = dict(row.get("headers") or {})
    properties = {str(k): str(v) for k, v in headers.items() if k != PROP_ENC}
    created: dt.datetime = row["gmt_create"]
    properties.update({
        PROP_ID: row["message_id"],
        PROP_BIZ: f"{row['biz_type']}:{row['biz_key']}",
        PROP_SRC: row.get("created_by") or "",
        PROP_SENT: str(to_epoch_ms(created)),
    })
    extra_keys = tuple(k for k in (row.get("keys") or "").split() if k != row["message_id"])
    return OutgoingMessage(
        topic=row["topic"],
        body=bytes(row["body"]),
        tags=row.get("tags") or None,
        keys=(row["message_id"], *extra_keys),
        properties=properties,
        sharding_key=str(row["biz_key"]),
    )
