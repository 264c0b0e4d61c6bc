"""Configurable table names: each validated as an SQL identifier."""

from __future__ import annotations

import dataclasses

from consumer_kit.core.identifiers import validate_identifier

DEFAULT_OUTBOX_TABLE = "ckit_outbox"
DEFAULT_RECEIPT_TABLE = "ckit_outbox_receipt"
DEFAULT_PROCESSED_TABLE = "ckit_processed"
DEFAULT_MQ_PREFIX = "ckit_mq"


@dataclasses.dataclass(frozen=True)
class TableNames:
    """Names of every table; each is validated as an SQL identifier."""

    outbox: str = DEFAULT_OUTBOX_TABLE
    receipts: str = DEFAULT_RECEIPT_TABLE
    processed: str = DEFAULT_PROCESSED_TABLE
    mq_prefix: str = DEFAULT_MQ_PREFIX

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            validate_identifier(getattr(self, field.name), what=field.name.replace("_", " "))

    @property
    def outbox_archive(self) -> str:
        """Name of the archive table that `ckit outbox archive` moves terminal rows into."""
        return validate_identifier(f"{self.outbox}_archive")
