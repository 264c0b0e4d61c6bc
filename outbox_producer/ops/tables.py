"""The tables the operator commands work on: the outbox, its receipts and its archive."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from consumer_kit.core.ddl import apply_table_options
from consumer_kit.core.schema import (
    TableNames,
    outbox_archive_table,
    outbox_table,
    receipt_table,
)


@dataclasses.dataclass(frozen=True)
class OutboxTables:
    """The tables the operator commands work on (outbox, its ack rows, its archive)."""

    outbox: sa.Table
    receipts: sa.Table
    archive: sa.Table

    @classmethod
    def from_names(cls, names: TableNames | None = None) -> OutboxTables:
        """Build the tables for validated names (`ConfigError` is raised by `TableNames`)."""
        names = names or TableNames()
        metadata = sa.MetaData()
        tables = cls(
            outbox=outbox_table(metadata, names.outbox),
            receipts=receipt_table(metadata, names.receipts),
            archive=outbox_archive_table(metadata, names.outbox_archive),
        )
        apply_table_options(metadata)
        return tables
