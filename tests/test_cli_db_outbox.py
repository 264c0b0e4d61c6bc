"""`ckit db` and `ckit outbox` through typer's CliRunner: usage mistakes on SQLite (`sqlite_db`),
commands that read or move rows on SQLite, MariaDB and PostgreSQL (`db`).

User mistakes must end in one `error:` line and a non-zero exit, never a traceback or a password.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import Result

from consumer_kit.core.clock import utcnow
from consumer_kit.core.states import OutboxState
from outbox_producer import ops
from tests.cli import invoke, without_ckit_env
from tests.conftest import Db

SECRET_URL = "mysql+pymysql://u:SECRET@127.0.0.1:1/x"


@pytest.fixture(autouse=True)
def _no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    without_ckit_env(monkeypatch)


ckit = invoke


def assert_one_error_line(result: Result, code: int, text: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: ") and text in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def insert(db: Db, state: OutboxState = OutboxState.PENDING, **fields: Any) -> dict[str, Any]:
    now = utcnow()
    created = fields.pop("gmt_create", now)
    row: dict[str, Any] = {
        "message_id": f"m-{uuid.uuid4().hex}", "biz_type": "ORDER_CREATED",
        "biz_key": f"k-{uuid.uuid4().hex[:6]}", "topic": "ORDERS", "body": b'{"a": 1}',
        "state": int(state), "next_retry_at": created, "gmt_create": created,
        "gmt_modified": created, **fields,
    }  # fmt: skip
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.begin() as conn:
        row["id"] = conn.execute(sa.insert(outbox).values(**row)).inserted_primary_key[0]  # type: ignore[index]
    return row


def state_of(db: Db, row_id: int) -> OutboxState:
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.connect() as conn:
        query = sa.select(outbox.c.state).where(outbox.c.id == row_id)
        return OutboxState(conn.execute(query).scalar_one())


def opts(db: Db) -> list[str]:
    return ["--url", db.url, "--outbox-table", db.names.outbox]


def retry_opts(db: Db) -> list[str]:
    """`retry` also deletes the re-queued rows' ack rows: it needs the ack table too."""
    return [*opts(db), "--receipt-table", db.names.receipts]


# -------------------------------------------------------------------------------------------- db


def test_db_init_creates_the_tables_then_reports_them_already_present(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'init.db'}"
    first = ckit("db", "init", "--url", url, "--outbox-table", "my_outbox")
    second = ckit("db", "init", "--url", url, "--outbox-table", "my_outbox", "--json")
    assert first.exit_code == 0, first.output
    assert "my_outbox: created" in first.stdout and "my_outbox_archive: created" in first.stdout
    data = json.loads(second.stdout)
    assert data["created"] == [] and "my_outbox" in data["already_present"]


def test_db_ddl_prints_the_ddl_for_a_dialect() -> None:
    result = ckit("db", "ddl", "--dialect", "postgresql")
    assert result.exit_code == 0
    assert "CREATE TABLE ckit_outbox (" in result.stdout and "COMMENT ON TABLE" in result.stdout


def test_db_ddl_with_an_unknown_dialect_is_one_error_line() -> None:
    assert_one_error_line(ckit("db", "ddl", "--dialect", "oracle"), 2, "unknown dialect 'oracle'")


def test_db_init_rejects_a_bad_table_name(tmp_path: Path) -> None:
    result = ckit("db", "init", "--url", f"sqlite:///{tmp_path / 'x.db'}",
                  "--outbox-table", "x; drop table")
    assert_one_error_line(result, 2, "invalid outbox 'x; drop table'")


@pytest.mark.parametrize(("command", "said"), [
    (["db", "init", "--outbox-table", "orders", "--processed-table", "orders"],
     "the outbox table and the processed table are both named 'orders'"),
    (["db", "ddl", "--receipt-table", "orders_archive", "--outbox-table", "orders"],
     "the outbox archive table and the receipt table are both named 'orders_archive'"),
    (["db", "init", "--processed-table", "ckit_mq_queue"],
     "the processed table and the SQL transport's queue table are both named 'ckit_mq_queue'"),
    (["outbox", "retry", "1", "--outbox-table", "orders", "--receipt-table", "ORDERS"],
     "the outbox table and the receipt table are named 'orders' and 'ORDERS'"),
    (["outbox", "show", "1", "--outbox-table", "orders", "--receipt-table", "orders"],
     "both named 'orders'"),
], ids=["init", "ddl", "mq", "retry", "show"])
def test_two_table_options_naming_one_table_are_one_line_naming_both(
        tmp_path: Path, command: list[str], said: str) -> None:
    # it said "database error: InvalidRequestError: Table 'orders' is already defined for this
    # MetaData instance. Specify 'extend_existing=True' ...", naming neither option
    url = f"sqlite:///{tmp_path / 'names.db'}"
    assert ckit("db", "init", "--url", url).exit_code == 0
    result = ckit(*command, *(["--url", url] if command[:2] != ["db", "ddl"] else []))
    assert_one_error_line(result, 2, said)
    assert "MetaData" not in result.stderr


def test_db_init_never_prints_the_password_of_an_unreachable_database() -> None:
    result = ckit("db", "init", "--url", SECRET_URL)
    assert result.exit_code != 0 and "SECRET" not in result.output
    assert result.stderr.startswith("error: database error")


# --------------------------------------------------------------------------------------- outbox


@pytest.mark.parametrize("command", [
    ["outbox", "stats"], ["outbox", "show", "x"], ["outbox", "retry", "1"],
    ["outbox", "suspend", "1"], ["outbox", "resume", "1"], ["outbox", "archive"],
    ["db", "init"],
])  # fmt: skip
def test_every_command_without_a_url_says_so_in_one_line(command: list[str]) -> None:
    result = ckit(*command)
    assert_one_error_line(result, 2, "missing --url (or set CKIT_DB_URL)")


def test_the_url_can_come_from_ckit_db_url(sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKIT_DB_URL", sqlite_db.url)
    result = ckit("outbox", "stats", "--outbox-table", sqlite_db.names.outbox)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", [["outbox", "stats"], ["outbox", "archive"]])
def test_outbox_commands_never_print_the_password(command: list[str]) -> None:
    result = ckit(*command, "--url", SECRET_URL)
    assert result.exit_code != 0 and "SECRET" not in result.output
    assert "Traceback" not in result.output


def test_a_bad_table_name_is_one_error_line(sqlite_db: Db) -> None:
    result = ckit("outbox", "stats", "--url", sqlite_db.url, "--outbox-table", "x; drop table")
    assert_one_error_line(result, 2, "invalid")


def test_a_missing_table_points_at_ckit_db_init(db: Db) -> None:
    result = ckit("outbox", "stats", "--url", db.url, "--outbox-table", "nope")
    assert_one_error_line(result, 2, "ckit db init")


def test_stats_prints_every_state_and_the_total(db: Db) -> None:
    # Given two FAILED rows and a CONSUMED row
    insert(db, OutboxState.FAILED)
    insert(db, OutboxState.FAILED)
    insert(db, OutboxState.CONSUMED)
    # When
    table = ckit("outbox", "stats", *opts(db))
    as_json = json.loads(ckit("outbox", "stats", *opts(db), "--json").stdout)
    # Then
    assert table.exit_code == 0 and "total: 3" in table.stdout and "SUSPENDED" in table.stdout
    assert as_json["counts"]["FAILED"] == 2 and as_json["counts"]["PENDING"] == 0


def test_show_prints_a_message_by_id_and_fails_for_an_unknown_one(db: Db) -> None:
    row = insert(db, OutboxState.SENT)
    args = [*opts(db), "--receipt-table", db.names.receipts]
    shown = ckit("outbox", "show", row["message_id"], *args)
    data = json.loads(ckit("outbox", "show", row["biz_key"], *args, "--json").stdout)
    missing = ckit("outbox", "show", "nothing-here", *args)
    assert shown.exit_code == 0 and "SENT (2)" in shown.stdout and "receipts: none" in shown.stdout
    assert data[0]["message"]["message_id"] == row["message_id"]
    assert_one_error_line(missing, 1, "no message with message_id or biz_key 'nothing-here'")


def test_retry_by_id_requeues_and_a_refusal_exits_1(db: Db) -> None:
    failed = insert(db, OutboxState.FAILED)
    consumed = insert(db, OutboxState.CONSUMED)
    ok = ckit("outbox", "retry", str(failed["id"]), *retry_opts(db))
    refused = ckit("outbox", "retry", consumed["message_id"], *retry_opts(db))
    forced = ckit("outbox", "retry", consumed["message_id"], "--force", *retry_opts(db))
    assert ok.exit_code == 0 and "retry: 1 changed, 0 refused" in ok.stdout
    assert refused.exit_code == 1 and "--force" in refused.stdout
    assert forced.exit_code == 0
    assert state_of(db, failed["id"]) is OutboxState.PENDING
    assert state_of(db, consumed["id"]) is OutboxState.PENDING


def test_bulk_retry_takes_state_topic_and_limit(db: Db) -> None:
    rows = [insert(db, OutboxState.FAILED, topic="A") for _ in range(3)]
    result = ckit("outbox", "retry", "--state", "failed", "--topic", "A", "--limit", "2",
                  *retry_opts(db), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["changed"] == [r["id"] for r in rows[:2]]


def test_bulk_retry_stopped_by_its_limit_says_rows_are_left(sqlite_db: Db) -> None:
    # Given three FAILED rows
    rows = [insert(sqlite_db, OutboxState.FAILED) for _ in range(3)]
    # When a bulk retry takes at most two, then at most one (the last), as text and as JSON
    first = ckit("outbox", "retry", "--state", "failed", "--limit", "2", *retry_opts(sqlite_db))
    last = ckit("outbox", "retry", "--state", "failed", "--limit", "1", *retry_opts(sqlite_db),
                "--json")
    # Then the first says a FAILED row is left (it said "2 changed" alone, as if that were all;
    # the default --limit 1000 hid the rest of a larger backlog); the last says none is
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == [
        "retry: 2 changed, 0 refused",
        "stopped at --limit 2: FAILED rows are left, run it again for the rest"]
    assert last.exit_code == 0, last.output
    assert json.loads(last.stdout)["changed"] == [rows[2]["id"]]
    assert json.loads(last.stdout)["more"] is False


def test_bulk_retry_of_a_topic_no_row_carries_is_refused_and_an_empty_state_is_said(
        sqlite_db: Db) -> None:
    # Given FAILED rows of topic A, none of B
    insert(sqlite_db, OutboxState.FAILED, topic="A")
    insert(sqlite_db, OutboxState.SENT, topic="B")
    # When the topic is misspelt, or names rows that are not FAILED
    typo = ckit("outbox", "retry", "--state", "failed", "--topic", "a", *opts(sqlite_db))
    none = ckit("outbox", "retry", "--state", "failed", "--topic", "B", *opts(sqlite_db))
    # Then the misspelt one is one error line (it exited 0 as "no FAILED rows"); the other
    # says it matched nothing
    assert_one_error_line(typo, 2, "no outbox row has topic 'a'")
    assert none.exit_code == 0 and "no FAILED rows for topic B" in none.stdout


def test_bulk_retry_of_a_topic_on_an_empty_or_archived_outbox_says_no_rows(
        tmp_path: Path) -> None:
    # Given an empty outbox, then one whose only row of topic A went to the archive
    url = f"sqlite:///{tmp_path / 'o.db'}"
    assert ckit("db", "init", "--url", url).exit_code == 0
    args = ("outbox", "retry", "--state", "failed", "--topic", "A", "--url", url)
    empty = ckit(*args)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO ckit_outbox_archive (id, message_id, biz_type, biz_key, topic, body, "
            "state, retry_count, max_retries, next_retry_at, lock_version, gmt_create, "
            "gmt_modified) VALUES (1, 'm1', 't', 'k1', 'A', X'7B7D', 3, 0, 3, "
            "'2026-01-01', 1, '2026-01-01', '2026-01-01')"))
        conn.execute(sa.text(
            "INSERT INTO ckit_outbox (message_id, biz_type, biz_key, topic, body, state, "
            "retry_count, max_retries, next_retry_at, lock_version, gmt_create, gmt_modified) "
            "VALUES ('m2', 't', 'k2', 'B', X'7B7D', 3, 0, 3, '2026-01-01', 1, '2026-01-01', "
            "'2026-01-01')"))
    engine.dispose()
    archived = ckit(*args)
    # When / Then: neither is a typo (a cron retrying per topic must not alert)
    for result in (empty, archived):
        assert result.exit_code == 0 and "no FAILED rows for topic A" in result.stdout, \
            result.output


def test_bulk_retry_of_consumed_rows_needs_force(sqlite_db: Db) -> None:
    result = ckit("outbox", "retry", "--state", "CONSUMED", *opts(sqlite_db))
    assert_one_error_line(result, 2, "--force")


def test_bulk_retry_of_sent_rows_needs_force(db: Db) -> None:
    row = insert(db, OutboxState.SENT)
    result = ckit("outbox", "retry", "--state", "SENT", *retry_opts(db))
    assert_one_error_line(result, 2, "--force")
    assert state_of(db, row["id"]) is OutboxState.SENT
    forced = ckit("outbox", "retry", "--state", "SENT", "--force", *retry_opts(db))
    assert forced.exit_code == 0, forced.output
    assert state_of(db, row["id"]) is OutboxState.PENDING


def test_retry_deletes_the_ack_rows_of_the_rows_it_requeues(db: Db) -> None:
    # Given a REJECTED row with the rejecting group's ack row, in a custom ack table
    row = insert(db, OutboxState.REJECTED)
    tables = ops.OutboxTables.from_names(db.names)
    with db.engine.begin() as conn:
        conn.execute(sa.insert(tables.receipts).values(
            message_id=row["message_id"], consumer_group="stock", outcome="rejected",
            received_at=utcnow()))
    # When
    result = ckit("outbox", "retry", str(row["id"]), *retry_opts(db))
    # Then
    assert result.exit_code == 0, result.output
    assert db.count(db.names.receipts) == 0


def test_retry_with_an_unknown_state_lists_the_valid_ones(sqlite_db: Db) -> None:
    result = ckit("outbox", "retry", "--state", "LOST", *opts(sqlite_db))
    assert_one_error_line(result, 2, "valid: 0=PENDING")


@pytest.mark.parametrize("args, message", [
    ([], "give the ids to retry"),
    (["1", "--state", "FAILED"], "not both"),
])  # fmt: skip
def test_retry_usage_mistakes_are_one_error_line(
    sqlite_db: Db, args: list[str], message: str
) -> None:
    assert_one_error_line(ckit("outbox", "retry", *args, *opts(sqlite_db)), 2, message)


def test_suspend_then_resume(db: Db) -> None:
    row = insert(db)
    suspended = ckit("outbox", "suspend", str(row["id"]), *opts(db))
    held = state_of(db, row["id"])
    again = ckit("outbox", "suspend", str(row["id"]), *opts(db))
    resumed = ckit("outbox", "resume", str(row["id"]), *opts(db))
    assert suspended.exit_code == 0 and held is OutboxState.SUSPENDED
    assert again.exit_code == 1 and "SUSPENDED" in again.stdout
    assert resumed.exit_code == 0 and state_of(db, row["id"]) is OutboxState.PENDING


def test_archive_moves_old_consumed_rows(db: Db) -> None:
    old = insert(db, OutboxState.CONSUMED, gmt_create=utcnow() - dt.timedelta(days=40))
    recent = insert(db, OutboxState.CONSUMED)
    dry = ckit("outbox", "archive", "--older-than", "30d", "--dry-run", *retry_opts(db))
    result = ckit("outbox", "archive", "--older-than", "30d", "--batch", "10",
                  *retry_opts(db))
    assert dry.exit_code == 0 and dry.stdout.startswith("1 rows")
    assert result.exit_code == 0 and "archived 1 rows in 1 batches" in result.stdout
    tables = ops.OutboxTables.from_names(db.names)
    with db.engine.connect() as conn:
        assert list(conn.scalars(sa.select(tables.archive.c.id))) == [old["id"]]
        assert list(conn.scalars(sa.select(tables.outbox.c.id))) == [recent["id"]]


def test_archive_with_a_bad_duration_is_one_error_line(sqlite_db: Db) -> None:
    result = ckit("outbox", "archive", "--older-than", "soon", *opts(sqlite_db))
    assert_one_error_line(result, 2, "not a duration")


@pytest.mark.parametrize("command", [
    ["outbox", "stats"], ["outbox", "archive"], ["outbox", "retry", "1"],
    ["outbox", "partitions", "show"], ["processed", "purge", "--group", "g"],
    ["receipts", "--producer", "orders", "--burst"],
])
def test_a_command_on_a_sqlite_file_that_is_not_there_refuses_and_makes_none(
        tmp_path: Path, command: list[str]) -> None:
    # Given a mistyped SQLite path in a folder that exists
    missing = tmp_path / "ordres.db"
    # When a command that works on existing tables is pointed at it
    result = ckit(*command, "--url", f"sqlite:///{missing}")
    # Then one line, and no empty file left behind (connecting used to make one)
    assert_one_error_line(result, 2, f"SQLite database {missing} does not exist")
    assert not missing.exists()


@pytest.mark.parametrize(("producer", "warned"), [("ordres", True), ("orders", False)])
def test_receipts_warns_when_no_recent_outbox_row_was_published_by_its_producer(
        db: Db, tmp_path: Path, producer: str, warned: bool) -> None:
    # Given an outbox whose rows were published by "orders"
    insert(db, created_by="orders")
    insert(db, created_by="orders")
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert ckit("db", "init", "--url", mq).exit_code == 0
    # When receipts are consumed for a producer name
    result = ckit("receipts", *retry_opts(db), "--producer", producer,
                  "--transport", f"sql+{mq}", "--burst")
    # Then a misspelt one is named in a warning with the producers found (it used to apply
    # nothing, silently), and the right one is not
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "consumer_kit.cli.receipts" in line]
    if warned:
        assert len(lines) == 1 and "--producer 'ordres'" in lines[0]
        assert "producers found: 'orders'" in lines[0]
    else:
        assert lines == []


@pytest.mark.parametrize(("target", "said"), [
    ("id:987654", "no outbox row with id 987654"),
    ("msg:nothing-here", "no message with message_id 'nothing-here'"),
    ("biz:order:nothing-here", "no message with biz key 'order:nothing-here'"),
], ids=["id", "msg", "biz"])
def test_show_of_a_missing_target_names_the_way_it_was_looked_up(
        sqlite_db: Db, target: str, said: str) -> None:
    # `show id:987654` said "no message with message_id or biz_key 'id:987654'": neither was
    # looked up, the row id was
    missing = ckit("outbox", "show", target, *opts(sqlite_db),
                   "--receipt-table", sqlite_db.names.receipts)
    assert_one_error_line(missing, 1, said)
