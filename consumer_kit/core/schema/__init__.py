"""Every consumer-kit table, defined once with SQLAlchemy Core (the DDL is generated from here).

>>> sorted(build_metadata(include_transport=False).tables)
['ckit_outbox', 'ckit_outbox_archive', 'ckit_outbox_receipt', 'ckit_processed']
"""

from __future__ import annotations

import sqlalchemy as sa

from consumer_kit.core.schema.mq import MqTables, mq_tables, validate_prefix
from consumer_kit.core.schema.names import (
    DEFAULT_MQ_PREFIX,
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_PROCESSED_TABLE,
    DEFAULT_RECEIPT_TABLE,
    MQ_TABLE_SUFFIXES,
    TableNames,
    check_distinct,
    check_outbox_names,
)
from consumer_kit.core.schema.tables import (
    ProcessedStatus,
    outbox_archive_table,
    outbox_table,
    processed_table,
    receipt_table,
)
from consumer_kit.core.schema.types import (
    BIZ_KEY_LEN,
    BIZ_TYPE_LEN,
    GROUP_LEN,
    KEYS_LEN,
    MESSAGE_ID_LEN,
    NAME_LEN,
    REASON_LEN,
    TAGS_LEN,
    TOPIC_LEN,
)

__all__ = [
    "BIZ_KEY_LEN", "BIZ_TYPE_LEN", "DEFAULT_MQ_PREFIX", "DEFAULT_OUTBOX_TABLE",
    "DEFAULT_PROCESSED_TABLE", "DEFAULT_RECEIPT_TABLE", "GROUP_LEN", "KEYS_LEN", "MESSAGE_ID_LEN",
    "MQ_TABLE_SUFFIXES", "NAME_LEN", "REASON_LEN", "TAGS_LEN", "TOPIC_LEN", "MqTables",
    "ProcessedStatus", "TableNames", "build_metadata", "check_distinct",
    "check_outbox_names", "mq_tables",
    "outbox_archive_table", "outbox_table", "processed_table", "receipt_table", "validate_prefix",
]


def build_metadata(names: TableNames | None = None, *, include_transport: bool = True
                   ) -> sa.MetaData:
    """A MetaData holding every consumer-kit table under the given names (with the SQL
    transport's tables unless `include_transport` is false)."""
    names = names or TableNames()
    check_distinct(names.by_role(transport=include_transport))
    metadata = sa.MetaData()
    outbox_table(metadata, names.outbox)
    outbox_archive_table(metadata, names.outbox_archive)
    receipt_table(metadata, names.receipts)
    processed_table(metadata, names.processed)
    if include_transport:
        mq_tables(names.mq_prefix, metadata)
    return metadata
