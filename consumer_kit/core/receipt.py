"""Receipts: a consumer group's answer for one outbox message, sent back to the producer.

Words (docs/architecture.md, "Words"): the *broker ack* is the consume status a consumer returns
to the broker; a *receipt* is what a consumer group sends to the producer's outbox (consumed or
rejected). Receipts travel on the producer's receipt topic (`ckit-receipt-<producer>`, one
message per batch, this module's JSON) or straight into the producer's database; both sides use
the `Receipt` type and this wire format.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable

from consumer_kit.core.errors import ReceiptError
from consumer_kit.core.schema.types import GROUP_LEN, MESSAGE_ID_LEN

RECEIPT_TOPIC_PREFIX = "ckit-receipt-"


def receipt_topic(producer: str) -> str:
    """The topic a producer's receipts travel on: `ckit-receipt-<producer>`."""
    return f"{RECEIPT_TOPIC_PREFIX}{producer}"


class ReceiptOutcome(str, enum.Enum):
    """What a consumer group answered for a message."""

    CONSUMED = "consumed"
    REJECTED = "rejected"


@dataclasses.dataclass(frozen=True)
class Receipt:
    """One consumer group's answer for one message.

    Raises:
        ReceiptError: an empty or over-long message id or group, or an unknown outcome.
    """

    message_id: str
    consumer_group: str
    outcome: ReceiptOutcome = ReceiptOutcome.CONSUMED
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.message_id or len(self.message_id) > MESSAGE_ID_LEN:
            raise ReceiptError(f"receipt has an invalid message id {self.message_id!r}")
        if not self.consumer_group or len(self.consumer_group) > GROUP_LEN:
            raise ReceiptError(f"receipt has an invalid consumer group {self.consumer_group!r}")
        try:
            object.__setattr__(self, "outcome", ReceiptOutcome(self.outcome))
        except ValueError:
            raise ReceiptError(f"receipt has an unknown outcome {self.outcome!r}") from None


def encode_receipts(receipts: Iterable[Receipt]) -> bytes:
    """The body of a receipt-topic message: a JSON list (one message carries a batch).

    >>> encode_receipts([Receipt("m1", "inventory")])
    b'[{"id":"m1","group":"inventory","outcome":"consumed"}]'
    """
    return json.dumps([
        {"id": r.message_id, "group": r.consumer_group, "outcome": r.outcome.value,
         **({"reason": r.reason} if r.reason else {})}
        for r in receipts
    ], separators=(",", ":")).encode()


def decode_receipts(body: bytes) -> list[Receipt]:
    """Parse a receipt-topic message body.

    Raises:
        ReceiptError: the body is not a JSON list of receipts (the message says what is wrong).
    """
    try:
        items = json.loads(body)
        if not isinstance(items, list):
            raise TypeError("not a list")
        return [Receipt(str(i["id"]), str(i["group"]),
                        ReceiptOutcome(i.get("outcome", "consumed")), i.get("reason"))
                for i in items]
    except ReceiptError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise ReceiptError(f"malformed receipt message: {type(exc).__name__}: {exc}") from None
