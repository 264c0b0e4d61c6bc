"""`ckit db init --upgrade`: bring tables an older consumer-kit made up to the definitions.

It converts MySQL/MariaDB tables whose text compares without case, or pads trailing spaces
(`utf8mb4_bin`), to the server's NO PAD binary collation (a table rebuild), adds the columns a
table lacks, and creates the indexes it lacks. MySQL/MariaDB and SQLite commit each of those
statements by itself, so an upgrade that fails part way leaves the earlier ones done;
PostgreSQL rolls the whole upgrade back. Either way the error is marked with what the database
shows changed (`core.progress`), read after the failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.schema.check import (
    case_folding_tables,
    missing_columns,
    padding_tables,
    server_collation,
)

Lacking = Sequence[tuple[sa.Table, Sequence[sa.Column[Any]]]]


def upgrade_statement(table: sa.Table, column: sa.Column[object], dialect: Dialect) -> str:
    """`ALTER TABLE ... ADD COLUMN ...` for a column an older table lacks, as `dialect` writes
    it (type, NULL, default and comment from the definition).

    Raises:
        ConfigError: the column is NOT NULL without a default (existing rows could not take
            it): no column of the schema is.
    """
    if not column.nullable and column.server_default is None:
        raise ConfigError(f"{table.name}.{column.name} is NOT NULL without a default: it cannot "
                          "be added to a table that has rows")
    preparer = dialect.identifier_preparer
    spec = str(sa.schema.CreateColumn(column).compile(dialect=dialect)).strip()
    return f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {spec}"


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What an upgrade changes, as the database shows it."""

    folding: frozenset[str]  # compare without case, or pad trailing spaces
    lacking: frozenset[str]  # "table.column"
    indexes: frozenset[str]

    @classmethod
    def read(cls, engine: Engine, tables: Sequence[sa.Table]) -> _Shape:
        inspector = sa.inspect(engine)
        return cls(
            folding=frozenset(case_folding_tables(engine, tables))
            | frozenset(padding_tables(engine, tables)),
            lacking=frozenset(f"{t.name}.{c.name}" for t, cols in missing_columns(engine, tables)
                              for c in cols),
            indexes=frozenset(str(i["name"]) for t in tables
                              for i in inspector.get_indexes(t.name) if i["name"]))

    def since(self, before: _Shape, collation: str) -> str | None:
        """What changed from `before` to this: "1 column added (t.c), 1 index created (ix)"."""
        changes = [(sorted(before.folding - self.folding), "table", "converted to " + collation),
                   (sorted(before.lacking - self.lacking), "column", "added"),
                   (sorted(self.indexes - before.indexes), "index", "created")]
        said = [f"{counted(len(names), noun, verb)} ({', '.join(names)})"
                for names, noun, verb in changes if names]
        return ", ".join(said) or None


def upgrade_tables(engine: Engine, tables: Sequence[sa.Table], lacking: Lacking,
                   created: str | None = None) -> None:
    """Convert, add the `lacking` columns and create the missing indexes of `tables` (that
    exist). An error is marked with what stays done: `created` (the tables `db init` made
    first) and what the database shows changed.

    Raises:
        ConfigError: a lacking column could not take existing rows (before any change).
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement.
    """
    statements = [upgrade_statement(t, c, engine.dialect) for t, cols in lacking for c in cols]
    before = _Shape.read(engine, tables)
    collation = server_collation(engine) if before.folding else ""
    with (committed_on_error(lambda: _done(engine, tables, before, created, collation)),
          engine.begin() as conn):
        for name in sorted(before.folding):  # a binary NO PAD collation only splits values:
            quoted = engine.dialect.identifier_preparer.quote(name)  # no unique key breaks
            conn.exec_driver_sql(f"ALTER TABLE {quoted} CONVERT TO CHARACTER SET utf8mb4 "
                                 f"COLLATE {collation}")
        for statement in statements:
            conn.exec_driver_sql(statement)
        for table in tables:
            for index in sorted(table.indexes, key=lambda i: str(i.name)):
                if index.name not in before.indexes:
                    index.create(conn)


def left_to_upgrade(engine: Engine, tables: Sequence[sa.Table]) -> str | None:
    """What `db init --upgrade` would still do to `tables` (that exist) besides adding columns,
    or None: "convert to utf8mb4_nopad_bin: a, b; create index: ix"."""
    shape = _Shape.read(engine, tables)
    indexes = sorted(str(i.name) for t in tables for i in t.indexes if i.name not in shape.indexes)
    said = []
    if shape.folding:
        said.append(f"convert to {server_collation(engine)}: {', '.join(sorted(shape.folding))}")
    if indexes:
        said.append(f"create index: {', '.join(indexes)}")
    return "; ".join(said) or None


def _done(engine: Engine, tables: Sequence[sa.Table], before: _Shape,
          created: str | None, collation: str) -> str | None:
    try:
        changed = _Shape.read(engine, tables).since(before, collation)
    except Exception:  # the database is away too: claim only what is known
        changed = None
    return ", ".join(part for part in (created, changed) if part) or None
