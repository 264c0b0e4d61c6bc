"""Column types and lengths shared by every consumer-kit table (and by API validation)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect

#: The binary collation every server has. It compares with case, but pads: on MariaDB and on
#: MySQL 8 "E-1" and "E-1 " are equal under it (one primary key, one unique key).
PAD_BINARY_COLLATION = "utf8mb4_bin"
#: The NO PAD binary collations, which compare every byte: MariaDB 10.2+ and MySQL 8.0.17+.
MARIADB_NOPAD_COLLATION = "utf8mb4_nopad_bin"
MYSQL_NOPAD_COLLATION = "utf8mb4_0900_bin"


def mysql_collation(dialect: Dialect) -> str:
    """The collation consumer-kit's tables take on the MySQL/MariaDB server behind `dialect`
    (connected once, so its version is known): the NO PAD binary one where the server has it,
    else `utf8mb4_bin` (MySQL 5.7, MariaDB 10.1, or a version not known yet).

    >>> from sqlalchemy.dialects import mysql
    >>> mysql_collation(mysql.dialect())
    'utf8mb4_bin'
    """
    version = tuple(v for v in (dialect.server_version_info or ()) if isinstance(v, int))
    if getattr(dialect, "is_mariadb", False):
        return MARIADB_NOPAD_COLLATION if version >= (10, 2) else PAD_BINARY_COLLATION
    return MYSQL_NOPAD_COLLATION if version >= (8, 0, 17) else PAD_BINARY_COLLATION


def _server_collation(table: sa.Table, connection: sa.Connection, **_: Any) -> None:
    """`before_create` of every consumer-kit table: on MySQL/MariaDB, the collation of the
    server it is created on (`mysql_collation`); the static DDL keeps `utf8mb4_bin`."""
    if connection.dialect.name == "mysql":
        table.dialect_options["mysql"]["collate"] = mysql_collation(connection.dialect)


#: Every table's MySQL/MariaDB options: InnoDB, utf8mb4, and a binary collation, NO PAD where
#: the server has one (chosen as the table is created: `_server_collation`). The server's
#: default utf8mb4 collation ignores case (and trailing spaces): ids, keys, topics and group
#: names that differ only in case would be one (a foreign KEYS "a1" a duplicate of "A1", a
#: group "billing" reading "Billing"'s offsets and processed rows, biz key "Order-1" published
#: as "order-1"); `utf8mb4_bin` still pads, so dedupe keys "E-1" and "E-1 " were one processed
#: row (the second message acked as a duplicate without running).
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                               "mysql_collate": PAD_BINARY_COLLATION,
                               "listeners": [("before_create", _server_collation)]}
#: Maximum lengths, shared by validation in the API and the column definitions.
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
