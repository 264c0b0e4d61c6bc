"""Errors of the producer half; all derive from `consumer_kit.errors.CkitError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consumer_kit.errors import CkitError, TransportUnavailable

if TYPE_CHECKING:
    from outbox_producer.sender import SendStats


class OutboxError(CkitError):
    """Root of the producer half's errors."""


class PayloadError(OutboxError, ValueError):
    """The payload cannot be serialized, or a field is too long; nothing was written."""


class AckError(OutboxError, ValueError):
    """An ack message is malformed (it is logged and skipped, never half-applied)."""


class BrokerUnavailable(OutboxError, TransportUnavailable):
    """The broker could not be reached in the middle of a batch, so the batch stopped.

    The rows sent before were marked SENT; the unsent ones were put back to PENDING without
    counting a retry (an outage is waited out, not charged to the messages). `stats` holds what
    the batch did.
    """

    def __init__(self, message: str, stats: SendStats) -> None:
        super().__init__(message)
        self.stats = stats
