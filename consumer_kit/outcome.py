"""What happened to a delivery, and the one place that turns it into the broker ack."""

from __future__ import annotations

import dataclasses
import enum

from consumer_kit.core.messages import ConsumeStatus, Verdict


class Outcome(enum.Enum):
    """The pipeline's verdict for one delivery."""

    SUCCEEDED = "succeeded"      # handler committed with its processed row
    DUPLICATE = "duplicate"      # processed already (Redis, local memory or the processed table)
    REJECTED = "rejected"        # permanent failure recorded FAILED
    BUSY = "busy"                # another consumer holds the handler lease
    RETRY = "retry"              # transient failure, nothing recorded: redeliver later
    DEAD_LETTER = "dead_letter"  # transient failure on the last attempt: recorded FAILED, and
                                 # the transport moves the message to the group's dead letters


#: Outcomes backed by a durable record that end the message here: the broker is acked.
DURABLE = frozenset({Outcome.SUCCEEDED, Outcome.DUPLICATE, Outcome.REJECTED})


@dataclasses.dataclass(frozen=True)
class Result:
    """An outcome with its reason (for logs, the transport's retry copy and tests)."""

    outcome: Outcome
    reason: str | None = None
    #: a duplicate of a rejection: the message may still run again (a re-send), so it must not
    #: be remembered as done (in Redis or in memory)
    may_run_again: bool = False


def broker_ack(result: Result) -> Verdict:
    """Ack the broker only when a durable record exists (succeeded, rejected, or a duplicate of
    one); everything else is redelivered later (or, on the last attempt, dead-lettered), with
    its reason. A busy answer (another consumer holds the lease and may still finish the message)
    does not spend one of the message's reconsume times."""
    if result.outcome in DURABLE:
        return _ACK
    return Verdict(ConsumeStatus.RECONSUME_LATER, result.reason or "",
                   spend=result.outcome is not Outcome.BUSY)


#: the one success answer (a frozen value: one instance serves every message)
_ACK = Verdict(ConsumeStatus.CONSUME_SUCCESS)
