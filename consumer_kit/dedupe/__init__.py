"""Deduplication: the Redis fast path and the in-process memory of finished ids."""

from __future__ import annotations

from consumer_kit.dedupe.local import RecentlyDone
from consumer_kit.dedupe.redis_store import Claim, RedisDedupe

__all__ = ["Claim", "RecentlyDone", "RedisDedupe"]
