"""The tables the operator commands work on: the outbox, its receipts and its archive, and the
key table of a partitioned outbox."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from consumer_kit.core.ddl import apply_table_options
from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.schema import (
    TableNames,
    check_distinct,
    outbox_archive_table,
    outbox_table,
    receipt_table,
)
from consumer_kit.core.schema.types import MYSQL_TABLE


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
        roles = names.by_role(transport=False)
        check_distinct({role: roles[role] for role in
                        ("outbox table", "outbox archive table", "receipt table")})
        metadata = sa.MetaData()
        tables = cls(
            outbox=outbox_table(metadata, names.outbox),
            receipts=receipt_table(metadata, names.receipts),
            archive=outbox_archive_table(metadata, names.outbox_archive),
        )
        apply_table_options(metadata)
        return tables


def key_table(metadata: sa.MetaData, outbox: str) -> sa.Table:
    """`<outbox>_key`: the publish-once key of a partitioned outbox."""
    name = validate_identifier(f"{outbox}_key")
    outbox_cols = outbox_table(sa.MetaData(), outbox).c
    return sa.Table(
        name, metadata,
        sa.Column("biz_type", outbox_cols.biz_type.type, primary_key=True),
        sa.Column("biz_key", outbox_cols.biz_key.type, primary_key=True),
        sa.Column("message_id", outbox_cols.message_id.type, nullable=False),
        sa.Column("gmt_create", outbox_cols.gmt_create.type, nullable=False),
        sa.Index(f"ix_{name}_message_id", "message_id"),
        comment="consumer-kit: (biz_type, biz_key) of a partitioned outbox, published once",
        **MYSQL_TABLE,
    )
