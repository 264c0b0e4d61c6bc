"""Every Redis key consumer-kit uses is built here."""

from __future__ import annotations

PREFIX = "ckit"


def done_key(group: str, message_id: str) -> str:
    """Set when `group` has processed `message_id` (TTL: the dedupe window)."""
    return f"{PREFIX}:{{{group}}}:done:{message_id}"


def lease_key(group: str, message_id: str) -> str:
    """Held while one consumer of `group` processes `message_id`."""
    return f"{PREFIX}:{{{group}}}:lease:{message_id}"


def owner_key(group: str) -> str:
    """Names the processed table whose consumers last started with `group`'s keys here."""
    return f"{PREFIX}:{{{group}}}:owner"
