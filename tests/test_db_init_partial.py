"""`ckit db init` stopped by a failing CREATE part way: where each CREATE commits by itself
(MariaDB, SQLite) the line names the tables made and the exit is 1; where the DDL is one
transaction (PostgreSQL) nothing stays and the exit is 2, "nothing was done"."""

from __future__ import annotations

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
from tests.cli import error_line
from tests.conftest import DB_KINDS, database_url


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
