"""A real database error on one chosen row: a trigger that refuses the row's INSERT, UPDATE or
DELETE on SQLite, MariaDB and PostgreSQL. Batch runs meet it part way through, after their
earlier batches committed."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy as sa

#: the text every poisoned statement fails with
POISON = "poisoned row"


@contextlib.contextmanager
def refused(engine: sa.Engine, table: str, event: str, column: str, value: str
            ) -> Iterator[None]:
    """While the block runs, `event` ("INSERT", "UPDATE" or "DELETE") on a row of `table`
    whose `column` is `value` fails with a database error saying `POISON`."""
    assert event in ("INSERT", "UPDATE", "DELETE")
    assert "'" not in value
    row = "NEW" if event == "INSERT" else "OLD"  # the row the condition reads
    kept = "OLD" if event == "DELETE" else "NEW"  # what a PostgreSQL trigger lets through
    name = f"poison_{uuid.uuid4().hex[:12]}"
    dialect = engine.dialect.name
    with engine.begin() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE {event} ON {table} "
                f"WHEN {row}.{column} = '{value}' BEGIN SELECT RAISE(ABORT, '{POISON}'); END")
        elif dialect == "mysql":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW BEGIN "
                f"IF {row}.{column} = '{value}' THEN "
                f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{POISON}'; END IF; END")
        else:
            conn.exec_driver_sql(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"IF {row}.{column} = '{value}' THEN RAISE EXCEPTION '{POISON}'; END IF; "
                f"RETURN {kept}; END $$ LANGUAGE plpgsql")
            conn.exec_driver_sql(f"CREATE TRIGGER {name} BEFORE {event} ON {table} "
                                 f"FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        yield
    finally:
        with engine.begin() as conn:
            if dialect == "postgresql":
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {name}()")
            else:
                conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
