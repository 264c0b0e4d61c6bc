"""Column types and lengths shared by every consumer-kit table (and by API validation)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

#: Maximum lengths, shared by validation in the API and the column definitions.
#: Every table's MySQL/MariaDB options: InnoDB, utf8mb4, and a binary collation. The server's
#: default utf8mb4 collation ignores case (and trailing spaces): ids, keys, topics and group
#: names that differ only in case would be one (a foreign KEYS "a1" a duplicate of "A1", a
#: group "billing" reading "Billing"'s offsets and processed rows, biz key "Order-1" published
#: as "order-1").
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                               "mysql_collate": "utf8mb4_bin"}
MESSAGE_ID_LEN = 128
BIZ_TYPE_LEN = 64
BIZ_KEY_LEN = 128
TOPIC_LEN = 255
TAGS_LEN = 255
KEYS_LEN = 512
GROUP_LEN = 128
NAME_LEN = 128
REASON_LEN = 2000


def big_id() -> sa.types.TypeEngine[Any]:
    """BIGINT primary key that still autoincrements on SQLite (which needs INTEGER)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def timestamp() -> sa.types.TypeEngine[Any]:
    """DATETIME with microseconds on MySQL/MariaDB (plain DATETIME would drop them)."""
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def blob() -> sa.types.TypeEngine[Any]:
    """Message bodies: MEDIUMBLOB (16 MiB) on MySQL, BYTEA on PostgreSQL, BLOB on SQLite."""
    return (
        sa.LargeBinary()
        .with_variant(mysql.MEDIUMBLOB(), "mysql", "mariadb")
        .with_variant(postgresql.BYTEA(), "postgresql")
    )


def long_text() -> sa.types.TypeEngine[Any]:
    """Long free text (errors, reasons) that may exceed VARCHAR limits."""
    return sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
