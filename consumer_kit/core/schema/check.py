"""Whether existing tables match the definitions: the columns a table made by an older
consumer-kit lacks, and on MySQL/MariaDB text columns that compare without case (`ckit db init
--upgrade` adds the first and converts the second)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine


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


#: The collation every text column of a consumer-kit table has on MySQL/MariaDB
#: (`consumer_kit.core.schema.types.MYSQL_TABLE`)
BINARY_COLLATION = "utf8mb4_bin"


def case_folding_tables(engine: Engine, tables: Sequence[sa.Table]) -> list[str]:
    """MySQL/MariaDB: those of `tables` with a text column whose collation ignores case (made
    by an older consumer-kit, under the server's default collation): there, ids, keys, topics
    and group names that differ only in case are one. Empty elsewhere."""
    if engine.dialect.name != "mysql" or not tables:
        return []
    query = sa.text(
        "SELECT DISTINCT TABLE_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
        "DATABASE() AND TABLE_NAME IN :names AND COLLATION_NAME IS NOT NULL AND "
        "COLLATION_NAME NOT LIKE '%\\_bin' ORDER BY TABLE_NAME"
    ).bindparams(sa.bindparam("names", expanding=True))
    with engine.connect() as conn:
        return [str(name) for name in conn.execute(query, {"names": [t.name for t in tables]})
                .scalars()]
