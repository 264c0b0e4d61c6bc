"""Whether existing tables match the definitions: the columns a table made by an older
consumer-kit lacks (`ckit db init --upgrade` adds them)."""

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
