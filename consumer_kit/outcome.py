"""What happened to a delivery, and the one place that turns it into the broker's answer."""

from __future__ import annotations

import dataclasses
import enum

from consumer_kit.core.messages import ConsumeStatus


class Outcome(enum.Enum):
    """The pipeline's verdict for one delivery."""

    SUCCEEDED = "succeeded"   # handler committed with its processed row
    DUPLICATE = "duplicate"   # already processed (Redis, local memory or the processed table)
    REJECTED = "rejected"     # permanent failure recorded FAILED
    BUSY = "busy"             # another consumer holds the lease
    RETRY = "retry"           # transient failure, nothing recorded


#: outcomes backed by a durable record: the broker is acked, the message is done
DURABLE = frozenset({Outcome.SUCCEEDED, Outcome.DUPLICATE, Outcome.REJECTED})


@dataclasses.dataclass(frozen=True)
class Result:
    """An outcome with its reason (for logs and tests)."""

    outcome: Outcome
    reason: str | None = None


def broker_status(outcome: Outcome) -> ConsumeStatus:
    """Ack the broker only when a durable record exists (succeeded, rejected, or a duplicate of
    one); everything else is redelivered later."""
    if outcome in DURABLE:
        return ConsumeStatus.CONSUME_SUCCESS
    return ConsumeStatus.RECONSUME_LATER
