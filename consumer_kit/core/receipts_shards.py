"""Applying receipts to a sharded producer: each receipt to the database that holds its message.

A producer whose outbox is split over databases (one per shard, one producer name) gets the
receipts of every shard on one receipt topic (`ckit-receipt-<producer>`), and a consumer's
receipt sender batches them together. One `ReceiptApplier` per shard, each given the whole
batch, would record the other shards' receipts in its own database and leave their rows SENT;
`ShardedReceiptApplier` looks each batch's message ids up in each database (by the unique
`message_id` index) and hands every database only the receipts of its own messages. Receipts
of a message no database holds (another producer's, or archived) are counted unknown, named in
one warning, and recorded nowhere.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.receipts_applier import (
    INSERT_CHUNK,
    UNKNOWN_LOGGED,
    ReceiptApplier,
    ReceiptResult,
)

log = logging.getLogger(__name__)


class ShardedReceiptApplier:
    """Applies batches of receipts to the outboxes of several producer databases, each receipt
    to the one holding its message (one `ReceiptApplier` each, in its own transaction: a batch
    that fails part way is applied again whole, which changes nothing where it was applied).

    >>> ShardedReceiptApplier([ReceiptApplier(a), ReceiptApplier(b)]).apply(receipts)
    ... # doctest: +SKIP
    """

    def __init__(self, appliers: Sequence[ReceiptApplier]) -> None:
        if not appliers:
            raise ConfigError("give at least one producer database (--url)")
        self.appliers = list(appliers)
        #: the outbox table (the same name in every database)
        self.table = self.appliers[0].table

    def apply(self, receipts: Sequence[Receipt]) -> ReceiptResult:
        """Apply each receipt to the database holding its message; return the totals."""
        if len(self.appliers) == 1:
            return self.appliers[0].apply(receipts)
        result = ReceiptResult(received=len(receipts))
        left = sorted({r.message_id for r in receipts})
        owner: dict[str, int] = {}
        for index, applier in enumerate(self.appliers):
            if not left:
                break
            for message_id in _held(applier, left):
                owner[message_id] = index
            left = [m for m in left if m not in owner]
        for index, applier in enumerate(self.appliers):
            part = [r for r in receipts if owner.get(r.message_id) == index]
            if part:
                done = applier.apply(part)
                done.received = 0  # (counted above)
                result.add(done)
        if left:
            result.unknown += len(left)
            log.warning("receipts for %d message id(s) in none of the %d producer databases "
                        "(another producer's, or archived): %s%s", len(left),
                        len(self.appliers), ", ".join(left[:UNKNOWN_LOGGED]),
                        " ..." if len(left) > UNKNOWN_LOGGED else "")
        return result


def _held(applier: ReceiptApplier, message_ids: list[str]) -> set[str]:
    """Those of `message_ids` that `applier`'s outbox holds."""
    t = applier.table
    found: set[str] = set()
    with applier.engine.connect() as conn:
        for start in range(0, len(message_ids), INSERT_CHUNK):
            found.update(str(m) for m in conn.execute(
                sa.select(t.c.message_id)
                .where(t.c.message_id.in_(message_ids[start:start + INSERT_CHUNK]))).scalars())
    return found
