"""What a relay batch did (`SendStats`), and what a batch stopped part way had committed,
carried on the error that stopped it (`carry_committed`, `committed_part`)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SendStats:
    """What one batch (or many, added up) did. `outage` is set when a broker outage stopped the
    batch: its unsent rows went back as they were before the claim (PENDING, or FAILED for the
    slow retry) without a retry counted; `released` counts them, and the rows the end of the
    send window left unsent."""

    sent: int = 0
    retried: int = 0
    failed: int = 0
    conflicts: int = 0
    released: int = 0
    #: messages the broker accepted whose SENT mark failed with the database: they stay
    #: SENDING until their lease ends and are sent again (consumers dedupe)
    unmarked: int = 0
    outage: str | None = None

    def committed(self) -> bool:
        """Whether these counts record any mark written (a send, a retry or a failure)."""
        return bool(self.sent or self.retried or self.failed)

    def add(self, other: SendStats) -> None:
        """Accumulate another batch's counts (the last outage wins)."""
        self.sent += other.sent
        self.retried += other.retried
        self.failed += other.failed
        self.conflicts += other.conflicts
        self.released += other.released
        self.unmarked += other.unmarked
        self.outage = other.outage or self.outage


#: the attribute of an error raised part way through a batch holding what it had committed
_PARTIAL = "ckit_batch_committed"


def carry_committed(exc: BaseException, stats: SendStats) -> None:
    """Record on `exc`, raised part way through a batch, the marks the batch had committed
    before it (a copy of `stats`): the relay counts them in its totals."""
    setattr(exc, _PARTIAL, dataclasses.replace(stats))


def committed_part(exc: BaseException) -> SendStats | None:
    """What the batch that raised `exc` had committed before it (`carry_committed`)."""
    stats = getattr(exc, _PARTIAL, None)
    return stats if isinstance(stats, SendStats) else None


def unmarked_text(count: int) -> str:
    """What becomes of `count` messages sent whose SENT mark was lost (`SendStats.unmarked`)."""
    return (f"{count:,} sent but not marked SENT (sent again when their lease ends, with "
            "--claim lock at once; consumers dedupe)")
