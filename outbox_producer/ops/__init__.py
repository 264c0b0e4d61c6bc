"""Operator actions on the outbox: `stats`, `show`, `retry`, `suspend`, `resume`, `archive`
(the library behind `ckit outbox`). Every state change goes through the state machine's
compare-and-set; every row argument is read by `resolve`.
"""

from __future__ import annotations

from outbox_producer.ops.archiving import (
    ARCHIVE_FLOOR,
    DEFAULT_ARCHIVE_BATCH,
    DEFAULT_ARCHIVE_MAX_BATCHES,
    ArchiveResult,
    archive,
    check_archive_floor,
)
from outbox_producer.ops.commands import (
    DEFAULT_BULK_LIMIT,
    Refusal,
    TransitionResult,
    resume,
    retry,
    retry_states,
    select_ids,
    suspend,
)
from outbox_producer.ops.resolve import resolve
from outbox_producer.ops.show import MessageView, show
from outbox_producer.ops.stats import DEFAULT_LAG_WINDOW, LagStats, OutboxStats, stats
from outbox_producer.ops.tables import OutboxTables

__all__ = [
    "ARCHIVE_FLOOR",
    "DEFAULT_ARCHIVE_BATCH",
    "DEFAULT_ARCHIVE_MAX_BATCHES",
    "DEFAULT_BULK_LIMIT",
    "DEFAULT_LAG_WINDOW",
    "ArchiveResult",
    "LagStats",
    "MessageView",
    "OutboxStats",
    "OutboxTables",
    "Refusal",
    "TransitionResult",
    "archive",
    "check_archive_floor",
    "resolve",
    "resume",
    "retry",
    "retry_states",
    "select_ids",
    "show",
    "stats",
    "suspend",
]
