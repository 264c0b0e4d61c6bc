"""Claiming among candidate rows found elsewhere: on a read replica, or named by a delayed check.

`CandidateClaimer.claim_among(ids, batch)` is `Claimer.claim` narrowed to `ids`: the same due
conditions, the same compare-and-set claim (SKIP LOCKED or the optimistic token), on the
primary. A candidate that is no longer due there (sent meanwhile, claimed by another relay,
suspended by an operator) is not claimed, so stale candidates cost a lookup, never a second send.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from consumer_kit.core.rows import OutboxRow
from outbox_producer.claim import Claimer


@dataclasses.dataclass
class CandidateClaimer(Claimer):
    """A `Claimer` that can be told which ids it may claim (`claim_among`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._among = threading.local()  # claims of several relay threads never mix

    def _sharded(self, clauses: list[Any]) -> list[Any]:
        """Every claim condition of `Claimer` (due rows, expired send leases) passes through
        here: during `claim_among` it also requires the row's id to be a candidate."""
        clauses = super()._sharded(clauses)
        among: Sequence[int] | None = getattr(self._among, "ids", None)
        if among is not None:
            clauses.append(self.table.c.id.in_(list(among)))
        return clauses

    def claim_among(self, ids: Sequence[int], batch: int) -> list[OutboxRow]:
        """Claim up to `batch` rows among `ids` that are still due (or whose send lease
        expired) on the primary; return them."""
        if not ids:
            return []
        self._among.ids = list(ids)
        try:
            return Claimer.claim(self, batch)
        finally:
            self._among.ids = None
