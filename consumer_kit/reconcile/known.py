"""Which message ids the producer knows: the orphan check's exact lookup.

A processed row is an orphan only when its message id is in neither the outbox nor the outbox's
archive (`ckit outbox archive` moves terminal rows there, so a consumer's row for an archived
message is not an orphan). The archive is looked up only when the table exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.schema import TableNames, outbox_archive_table, outbox_table

T = TypeVar("T")


class KnownIds:
    """Looks message ids up in the outbox table and, when it exists, its archive."""

    def __init__(self, engine: Engine, outbox: str) -> None:
        self.engine = engine
        metadata = sa.MetaData()
        self.tables = [outbox_table(metadata, outbox)]
        archive = TableNames(outbox=outbox).outbox_archive
        if sa.inspect(engine).has_table(archive):
            self.tables.append(outbox_archive_table(metadata, archive))

    def among(self, ids: Sequence[str]) -> set[str]:
        """The ids of `ids` that have an outbox or archive row (one query per table)."""
        known: set[str] = set()
        with self.engine.connect() as conn:
            for table in self.tables:
                missing = [i for i in ids if i not in known]
                if missing:
                    known.update(conn.execute(sa.select(table.c.message_id).where(
                        table.c.message_id.in_(missing))).scalars())
        return known
