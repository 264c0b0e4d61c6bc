"""`ckit outbox partitions create` either makes the whole partitioned outbox or leaves nothing.

MariaDB commits each CREATE by itself: a create that failed after its CREATE TABLE (a
`--days-ahead` over the server's 8,192 partitions, a user without the TRIGGER privilege) left
the outbox table behind, unpartitioned or without the trigger that keeps publish once per biz
key, and exited 2, "nothing was done"; running it again said the table exists.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.schema import TableNames
from outbox_producer.ops import partitions as parts
from tests.cli import error_line
from tests.conftest import Db, unique_names


@pytest.fixture
def names(mariadb: Db) -> Iterator[TableNames]:
    names = unique_names("pc")
    yield names
    with mariadb.engine.begin() as conn:
        for table in (names.outbox, f"{names.outbox}_key", names.receipts,
                      names.outbox_archive):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")


def create(db: Db, names: TableNames, *more: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["outbox", "partitions", "create", "--url", db.url,
                                      "--outbox-table", names.outbox, "--receipt-table",
                                      names.receipts, *more])
    return result.exit_code, result.output


def made(db: Db, names: TableNames) -> list[str]:
    there = set(sa.inspect(db.engine).get_table_names())
    return [t for t in (names.outbox, f"{names.outbox}_key") if t in there]


@pytest.mark.mariadb
def test_more_days_ahead_than_the_server_takes_partitions_is_refused_before_any_ddl(
        mariadb: Db, names: TableNames) -> None:
    code, output = create(mariadb, names, "--days-ahead", "9000")
    assert code == 2 and "--days-ahead 9000" in error_line(output), output
    assert made(mariadb, names) == []


@pytest.mark.mariadb
def test_a_create_that_fails_after_its_table_leaves_no_table_and_can_run_again(
        mariadb: Db, names: TableNames, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server that refuses the trigger (as for a user without the TRIGGER privilege)
    monkeypatch.setattr(parts, "key_trigger", lambda outbox: "CREATE TRIGGER no way")
    # When the partitioned outbox is created
    code, output = create(mariadb, names)
    # Then one line, exit 2, and neither the outbox nor its key table is left behind
    assert code == 2 and "database error" in error_line(output), output
    assert made(mariadb, names) == []
    # and once the server takes it, the create runs (it said "table ... exists")
    monkeypatch.undo()
    code, output = create(mariadb, names)
    assert code == 0, output
    assert made(mariadb, names) == [names.outbox, f"{names.outbox}_key"]


@pytest.mark.mariadb
def test_a_failed_create_keeps_a_key_table_that_was_there_before_it(
        mariadb: Db, names: TableNames, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the outbox's key table there already, holding a row (the create takes it as it is)
    key = f"{names.outbox}_key"
    with mariadb.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {key} (biz_type VARCHAR(64) NOT NULL, biz_key "
                             "VARCHAR(128) NOT NULL, message_id VARCHAR(64) NOT NULL, "
                             "PRIMARY KEY (biz_type, biz_key))")
        conn.exec_driver_sql(f"INSERT INTO {key} VALUES ('order', '1', 'm1')")
    # When a create fails after its own table (the trigger refused)
    monkeypatch.setattr(parts, "key_trigger", lambda outbox: "CREATE TRIGGER no way")
    code, output = create(mariadb, names)
    # Then what it made is gone, and the key table it did not make is kept with its row
    assert code == 2, output
    assert made(mariadb, names) == [key]
    with mariadb.engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {key}").scalar() == 1
