"""Errors of the producer half; all derive from `consumer_kit.errors.CkitError`."""

from __future__ import annotations

from consumer_kit.errors import CkitError


class OutboxError(CkitError):
    """Root of the producer half's errors."""


class PayloadError(OutboxError, ValueError):
    """The payload cannot be serialized, or a field is too long; nothing was written."""


class AckError(OutboxError, ValueError):
    """An ack message is malformed (it is logged and skipped, never half-applied)."""
