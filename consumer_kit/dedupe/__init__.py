"""Deduplication: the Redis fast path and the in-process memory of finished ids."""

from __future__ import annotations

from consumer_kit.dedupe.claims import Claim
from consumer_kit.dedupe.local import RecentlyDone
from consumer_kit.dedupe.pending import PendingClaim, Predictor
from consumer_kit.dedupe.redis_store import RedisDedupe

__all__ = ["Claim", "PendingClaim", "Predictor", "RecentlyDone", "RedisDedupe"]
