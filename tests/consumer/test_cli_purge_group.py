"""`ckit processed purge --group` naming a group the table holds no row of: said, not silent."""

from __future__ import annotations

import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from tests.conftest import Db


def purge(db: Db, group: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [
        "processed", "purge", "--url", db.url, "--group", group, "--older-than", "30d",
        "--processed-table", db.names.processed])
    return result.exit_code, result.stdout, result.stderr


def test_purging_a_group_the_table_holds_no_row_of_says_so(sqlite_db: Db) -> None:
    # Given a processed table holding rows of group inventory only
    with sqlite_db.engine.begin() as conn:
        conn.execute(sa.text(
            f"INSERT INTO {sqlite_db.names.processed} (consumer_group, message_id, topic, "
            "status, attempts, first_seen_at, processed_at) VALUES ('inventory', 'm1', 'T', "
            "'SUCCEEDED', 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    # When cron purges a misspelt group
    code, out, err = purge(sqlite_db, "inventroy")
    # Then it deletes nothing, and says the group has no row at all (a misspelt group in a
    # cron line purged nothing, run after run, with "deleted 0" as its only output)
    assert code == 0 and "deleted 0" in out
    assert "no row of group 'inventroy'" in err
    # and the right group's purge says nothing of the kind
    code, out, err = purge(sqlite_db, "inventory")
    assert code == 0 and "deleted 0" in out and "no row of group" not in err


def test_a_purge_stopped_by_max_batches_says_rows_may_be_left(sqlite_db: Db) -> None:
    # Given five rows of the group processed long ago
    with sqlite_db.engine.begin() as conn:
        for i in range(5):
            conn.execute(sa.text(
                f"INSERT INTO {sqlite_db.names.processed} (consumer_group, message_id, topic, "
                f"status, attempts, first_seen_at, processed_at) VALUES ('inventory', 'm{i}', "
                "'T', 'SUCCEEDED', 1, '2020-01-01 00:00:00', '2020-01-01 00:00:00')"))

    def bounded(*extra: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [
            "processed", "purge", "--url", sqlite_db.url, "--group", "inventory",
            "--processed-table", sqlite_db.names.processed, "--batch", "2",
            "--max-batches", "1", *extra])
        return result.exit_code, result.stdout

    # When a bounded run deletes one full batch / Then it says rows may be left
    code, out = bounded()
    assert code == 0 and "deleted 2" in out and "stopped at --max-batches 1" in out, out
    code, out = bounded("--json")
    assert code == 0 and '"more": true' in out, out
    # and the run that deletes the last row says nothing of the kind
    code, out = bounded()
    assert code == 0 and "deleted 1 " in out and "stopped" not in out, out
    assert sqlite_db.count(sqlite_db.names.processed) == 0
