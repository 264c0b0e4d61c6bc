"""`ckit db init` stopped by a failing CREATE part way: where each CREATE commits by itself
(MariaDB, SQLite) the line names the tables made and the exit is 1; where the DDL is one
transaction (PostgreSQL) nothing stays and the exit is 2, "nothing was done". `db init
--upgrade` stopped part way names the changes the tables show."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.cli.runtime import EXIT_FAILURE, EXIT_USAGE
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames
from consumer_kit.core.schema.check import server_collation
from tests.cli import error_line
from tests.conftest import DB_KINDS, Db, database_url


@pytest.fixture(params=DB_KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(kind, URL, table prefix); every table of the prefix is dropped afterwards."""
    url = database_url(request.param, tmp_path)
    prefix = f"i{uuid.uuid4().hex[:8]}"
    yield request.param, url, prefix
    engine = make_engine(url)
    with engine.begin() as conn:
        for name in sa.inspect(conn).get_table_names():
            if name.startswith(prefix):
                conn.exec_driver_sql(f"DROP TABLE {name}")
    engine.dispose()


def test_db_init_failing_at_its_third_table_says_which_tables_it_made(
        target: tuple[str, str, str]) -> None:
    kind, url, prefix = target
    names = TableNames(outbox=f"{prefix}_outbox", receipts=f"{prefix}_ack",
                       processed=f"{prefix}_processed", mq_prefix=f"{prefix}_mq")
    seen: list[str] = []

    def refuse_the_third(table: sa.Table, connection: Any, **_kw: Any) -> None:
        if table.name.startswith(prefix):
            seen.append(table.name)
            if len(seen) == 3:
                raise sa.exc.OperationalError(f"CREATE TABLE {table.name}", {},
                                              RuntimeError("no space left on device"))

    # Given a database that refuses the third CREATE TABLE
    event.listen(sa.Table, "before_create", refuse_the_third)
    try:
        # When the tables are initialized
        result = CliRunner().invoke(app, [
            "db", "init", "--url", url, "--outbox-table", names.outbox, "--receipt-table",
            names.receipts, "--processed-table", names.processed, "--mq-prefix", names.mq_prefix])
    finally:
        event.remove(sa.Table, "before_create", refuse_the_third)
    line = error_line(result.output)
    assert "no space left on device" in line
    if kind == "postgresql":  # one transaction: rolled back whole
        assert result.exit_code == EXIT_USAGE, result.output
        assert "after" not in line
        return
    # Then the line names the two tables that stay, and the exit is 1
    assert result.exit_code == EXIT_FAILURE, result.output
    made = ", ".join(sorted(seen[:2]))
    assert f"after 2 tables created ({made}): that stays committed" in line


def older_processed_table(db: Db) -> str:
    """Make `db`'s processed table as 0.1.0 made it: without the receipt columns and their
    index (and on MariaDB comparing text without case). Its name."""
    name = db.names.processed
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX ix_{name}_receipt_due"
                             + (f" ON {name}" if db.kind == "mariadb" else ""))
        for column in ("receipt_due_at", "receipt_attempts"):
            conn.exec_driver_sql(f"ALTER TABLE {name} DROP COLUMN {column}")
        if db.kind == "mariadb":
            conn.exec_driver_sql(f"ALTER TABLE {name} CONVERT TO CHARACTER SET utf8mb4 "
                                 "COLLATE utf8mb4_general_ci")
    return name


def test_db_init_upgrade_failing_at_an_index_says_which_changes_stay(db: Db) -> None:
    # Given a processed table an older version made, no SQL transport tables yet, and a
    # database refusing the processed table's new index
    name = older_processed_table(db)
    index = f"ix_{name}_receipt_due"

    def refuse_the_index(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("CREATE INDEX") and index in statement:
            raise sa.exc.OperationalError(statement, {}, RuntimeError("no space left on device"))

    event.listen(sa.engine.Engine, "before_cursor_execute", refuse_the_index)
    try:
        # When `ckit db init --upgrade` runs
        result = CliRunner().invoke(app, [
            "db", "init", "--upgrade", "--url", db.url, "--outbox-table", db.names.outbox,
            "--receipt-table", db.names.receipts, "--processed-table", name,
            "--mq-prefix", db.names.mq_prefix])
    finally:
        event.remove(sa.engine.Engine, "before_cursor_execute", refuse_the_index)
        made = sorted(t for t in sa.inspect(db.engine).get_table_names()
                      if t.startswith(db.names.mq_prefix))
        with db.engine.begin() as conn:
            for table in made:
                conn.exec_driver_sql(f"DROP TABLE {table}")
    # Then it exits 1, and its line names what stays done, as the tables show it: the
    # transport's tables it made (committed before the upgrade began), and where each ALTER
    # commits by itself (MariaDB, SQLite) the conversion and the columns; PostgreSQL rolled
    # the upgrade back whole
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert "no space left on device" in line
    done = f"{len(made)} tables created ({', '.join(made)})"
    assert len(made) == 6
    columns = {c["name"] for c in sa.inspect(db.engine).get_columns(name)}
    if db.kind == "postgresql":
        assert "receipt_due_at" not in columns
    else:
        assert {"receipt_due_at", "receipt_attempts"} <= columns
        if db.kind == "mariadb":
            done += f", 1 table converted to {server_collation(db.engine)} ({name})"
        done += f", 2 columns added ({name}.receipt_attempts, {name}.receipt_due_at)"
    assert f"(after {done}: that stays committed" in line


def test_db_init_without_upgrade_names_the_index_and_collation_an_upgrade_stopped_before(
        db: Db, caplog: pytest.LogCaptureFixture) -> None:
    from consumer_kit.core.ddl import init_db

    # Given a processed table an upgrade stopped part way through: its columns added, but not
    # its new index (and on MariaDB still comparing text without case); every column there, so
    # no command refuses it
    name = older_processed_table(db)
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN receipt_due_at "
                             + ("DATETIME(6)" if db.kind == "mariadb" else "TIMESTAMP"))
        conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN receipt_attempts INTEGER "
                             "DEFAULT 0 NOT NULL")
    try:
        # When `ckit db init` runs again without --upgrade
        with caplog.at_level(logging.WARNING, logger="consumer_kit.core.ddl"):
            made = init_db(db.engine, db.names)
        # Then it still leaves the table alone, but says what --upgrade would do (it reported
        # every table "already present", and the receipt shipper's query went without its index)
        assert made == [f"{db.names.mq_prefix}_{t}" for t in (
            "dlq", "member", "message", "offset", "queue", "queue_lease")]
        said = [r.getMessage() for r in caplog.records if "db init --upgrade" in r.getMessage()]
        assert len(said) == 1, caplog.text
        assert f"create index: ix_{name}_receipt_due" in said[0]
        if db.kind == "mariadb":
            assert f"convert to {server_collation(db.engine)}: {name}" in said[0]
        assert f"ix_{name}_receipt_due" not in {
            i["name"] for i in sa.inspect(db.engine).get_indexes(name)}
    finally:
        with db.engine.begin() as conn:
            for table in sa.inspect(db.engine).get_table_names():
                if table.startswith(db.names.mq_prefix):
                    conn.exec_driver_sql(f"DROP TABLE {table}")
