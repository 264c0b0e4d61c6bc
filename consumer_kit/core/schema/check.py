"""Whether existing tables match the definitions: the columns a table made by an older
consumer-kit lacks, and on MySQL/MariaDB text columns that compare without case or that pad
trailing spaces (`ckit db init --upgrade` adds the first and converts the others)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.schema.types import mysql_collation


def missing_columns(engine: Engine, tables: Sequence[sa.Table]
                    ) -> list[tuple[sa.Table, list[sa.Column[Any]]]]:
    """For each of `tables` that exists, the columns of its definition the database lacks."""
    inspector = sa.inspect(engine)
    found = []
    for table in tables:
        if not inspector.has_table(table.name):
            continue
        there = {c["name"].lower() for c in inspector.get_columns(table.name)}
        lacking = [c for c in table.columns if c.name.lower() not in there]
        if lacking:
            found.append((table, lacking))
    return found


def describe_missing(lacking: Sequence[tuple[sa.Table, Sequence[sa.Column[Any]]]]) -> str:
    """`table lacks a, b; other lacks c`."""
    return "; ".join(f"{t.name} lacks {', '.join(c.name for c in cols)}" for t, cols in lacking)


def other_tables(lacking: Sequence[tuple[sa.Table, Sequence[sa.Column[Any]]]]
                 ) -> list[tuple[sa.Table, Sequence[sa.Column[Any]]]]:
    """Those of `lacking` (`missing_columns`) that lack a column of their primary key or a
    NOT NULL column without a default. Every consumer-kit version made its tables with those
    (a column added later is nullable or has a default: `ckit db init --upgrade` adds it to
    tables with rows), so such a table is another table (a table option naming the wrong one:
    the processed table, the SQL transport's message table), not one an older version made:
    an upgrade could not mend it, and must not try (it would add columns to another table)."""
    return [(t, cols) for t, cols in lacking if any(_first_made(c) for c in cols)]


def _first_made(column: sa.Column[Any]) -> bool:
    return column.primary_key or (not column.nullable and column.server_default is None)


def describe_other(found: Sequence[tuple[sa.Table, Sequence[sa.Column[Any]]]]) -> str:
    """The line for `other_tables`: what each lacks, and which options to check."""
    firsts = sorted({c.name for _, cols in found for c in cols if _first_made(c)})
    return (f"{describe_missing(found)}, among them {', '.join(firsts)}, which every version "
            "made: not the table consumer-kit expects under that name (a table option naming "
            "another table? check --outbox-table, --receipt-table, --processed-table and "
            "--mq-prefix)")


def server_collation(engine: Engine) -> str:
    """The collation consumer-kit's tables take on `engine`'s MySQL/MariaDB server
    (`consumer_kit.core.schema.types.mysql_collation`; connects once to learn its version)."""
    if engine.dialect.server_version_info is None:
        with engine.connect():
            pass
    return mysql_collation(engine.dialect)


def case_folding_tables(engine: Engine, tables: Sequence[sa.Table]) -> list[str]:
    """MySQL/MariaDB: those of `tables` with a text column whose collation ignores case (made
    by an older consumer-kit, under the server's default collation): there, ids, keys, topics
    and group names that differ only in case are one. Empty elsewhere."""
    if engine.dialect.name != "mysql" or not tables:
        return []
    return _tables_with_columns(engine, tables, "COLLATION_NAME IS NOT NULL AND "
                                "COLLATION_NAME NOT LIKE '%\\_bin'")


def padding_tables(engine: Engine, tables: Sequence[sa.Table]) -> list[str]:
    """MySQL/MariaDB: those of `tables` with an identifier column (VARCHAR, CHAR) in a binary
    collation other than the server's NO PAD one (`utf8mb4_bin`, made by an older consumer-kit):
    there, ids and keys that differ only by trailing spaces are one ("E-1" and "E-1 ": one
    processed row, the second message acked as a duplicate without running). Empty elsewhere,
    and on a server without a NO PAD binary collation (MySQL 5.7)."""
    if engine.dialect.name != "mysql" or not tables:
        return []
    return _tables_with_columns(
        engine, tables, "DATA_TYPE IN ('varchar', 'char') AND COLLATION_NAME LIKE '%\\_bin' "
        "AND COLLATION_NAME <> :target", target=server_collation(engine))


def _tables_with_columns(engine: Engine, tables: Sequence[sa.Table], where: str,
                         **params: str) -> list[str]:
    """The names of those of `tables` (in this database) with a column `where` holds for, by
    `information_schema.COLUMNS`, in order."""
    query = sa.text(
        "SELECT DISTINCT TABLE_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
        f"DATABASE() AND TABLE_NAME IN :names AND {where} ORDER BY TABLE_NAME"
    ).bindparams(sa.bindparam("names", expanding=True))
    with engine.connect() as conn:
        return [str(name) for name in conn.execute(
            query, {"names": [t.name for t in tables], **params}).scalars()]
