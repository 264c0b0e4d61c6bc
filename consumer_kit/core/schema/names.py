"""Configurable table names: each validated as an SQL identifier."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.identifiers import validate_identifier

DEFAULT_OUTBOX_TABLE = "ckit_outbox"
DEFAULT_RECEIPT_TABLE = "ckit_outbox_receipt"
DEFAULT_PROCESSED_TABLE = "ckit_processed"
DEFAULT_MQ_PREFIX = "ckit_mq"
#: the SQL transport's tables are `<mq_prefix>_<suffix>`
MQ_TABLE_SUFFIXES = ("message", "queue", "offset", "queue_lease", "member", "dlq")


def check_distinct(tables: Mapping[str, str]) -> None:
    """Refuse two of `tables` (what each is -> its name) that name one table, also where
    names ignore case (MySQL on Windows and macOS, PostgreSQL's unquoted names): one would be
    read or written as the other.

    Raises:
        ConfigError: naming both, e.g. "the outbox table and the processed table are both
            named 'orders'".
    """
    seen: dict[str, tuple[str, str]] = {}
    for what, name in tables.items():
        if name.lower() in seen:
            first, first_name = seen[name.lower()]
            named = (f"both named {name!r}" if name == first_name
                     else f"named {first_name!r} and {name!r}")
            raise ConfigError(f"the {first} and the {what} are {named}: each table needs a "
                              "name of its own (check the table options)")
        seen[name.lower()] = (what, name)


def check_outbox_names(outbox: str, receipts: str) -> None:
    """`check_distinct` for a command given the outbox and receipt tables only (`ckit
    receipts`, `ckit reconcile`, the receipt applier): the outbox, its archive and its receipt
    table must be three tables.

    >>> check_outbox_names("orders", "orders_receipt")
    """
    check_distinct({"outbox table": outbox, "outbox archive table": f"{outbox}_archive",
                    "receipt table": receipts})


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

    def by_role(self, *, transport: bool = True) -> dict[str, str]:
        """Every table's name by what it is ("outbox table": "ckit_outbox", ...), the SQL
        transport's with `transport`."""
        named = {"outbox table": self.outbox, "outbox archive table": self.outbox_archive,
                 "receipt table": self.receipts, "processed table": self.processed}
        if transport:
            named.update({f"SQL transport's {suffix} table": f"{self.mq_prefix}_{suffix}"
                          for suffix in MQ_TABLE_SUFFIXES})
        return named

    @property
    def outbox_archive(self) -> str:
        """Name of the archive table that `ckit outbox archive` moves terminal rows into."""
        return validate_identifier(f"{self.outbox}_archive")
