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
        if not isinstance(self.message_id, str) or not isinstance(self.consumer_group, str):
            raise ReceiptError(f"receipt id and group must be text, got {self.message_id!r} and "
                               f"{self.consumer_group!r}")
        if self.reason is not None and not isinstance(self.reason, str):
            raise ReceiptError(f"receipt reason must be text, got {self.reason!r}")
        if not self.message_id or len(self.message_id) > MESSAGE_ID_LEN:
            raise ReceiptError(f"receipt has an invalid message id {_shown(self.message_id)} "
                               f"({len(self.message_id)} characters, 1-{MESSAGE_ID_LEN})")
        if not self.consumer_group or len(self.consumer_group) > GROUP_LEN:
            raise ReceiptError(f"receipt has an invalid consumer group "
                               f"{_shown(self.consumer_group)}")
        try:
            object.__setattr__(self, "outcome", ReceiptOutcome(self.outcome))
        except ValueError:
            raise ReceiptError(f"receipt has an unknown outcome {self.outcome!r}") from None


def _shown(value: str) -> str:
    """`value` for an error line: its repr, cut after 60 characters."""
    return repr(value) if len(value) <= 60 else repr(value[:60]) + "..."


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
    """Parse a receipt-topic message body, every entry valid.

    Raises:
        ReceiptError: the body is not a JSON list of receipts, or an entry is not a receipt (the
            message says what is wrong).
    """
    receipts, errors = read_receipts(body)
    if errors:
        raise ReceiptError(f"malformed receipt message: {errors[0]}")
    return receipts


def read_receipts(body: bytes) -> tuple[list[Receipt], list[str]]:
    """Parse a receipt-topic message body entry by entry: the valid receipts, and one line for
    each entry that is not one (so one bad entry cannot hold back the batch's others).

    >>> read_receipts(b'[{"id":"m1","group":"g"},{"id":null,"group":"g"}]')[1]
    ["entry 2: receipt id and group must be text, got None and 'g'"]

    Raises:
        ReceiptError: the body is not JSON, or not a list.
    """
    try:
        items = json.loads(body)
    except ValueError as exc:
        raise ReceiptError(f"malformed receipt message: {type(exc).__name__}: {exc}") from None
    if not isinstance(items, list):
        raise ReceiptError("malformed receipt message: not a JSON list")
    receipts: list[Receipt] = []
    errors: list[str] = []
    for number, item in enumerate(items, start=1):
        try:
            if not isinstance(item, dict):
                raise ReceiptError(f"not an object: {item!r}"[:200])
            receipts.append(Receipt(item.get("id"), item.get("group"),  # type: ignore[arg-type]
                                    item.get("outcome", "consumed"), item.get("reason")))
        except ReceiptError as exc:
            errors.append(f"entry {number}: {exc}")
    return receipts, errors
