"""Bounded tables without delete storms: archiving in small key-ordered batches with a pause,
receipt-driven archiving, and a day-partitioned outbox on MariaDB whose old days are dropped."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.schema import TableNames
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox, Relay, ops
from outbox_producer.ops import partitions as parts
from tests.cli import error_line
from tests.conftest import Db, unique_names
from tests.recording import RecordingTransport

FAST = dt.timedelta(microseconds=1)


def tables(db: Db) -> ops.OutboxTables:
    return ops.OutboxTables.from_names(db.names)


def publish(db: Db, keys: range, topic: str = "T", engine: sa.Engine | None = None,
            names: TableNames | None = None) -> list[str]:
    outbox = Outbox(engine or db.engine, producer="orders", table=(names or db.names).outbox)
    with (engine or db.engine).begin() as conn:
        return [outbox.publish(conn, topic, {"k": k}, biz_type="t", biz_key=f"{topic}{k}")
                for k in keys]


def consume(db: Db, receipts: list[Receipt], names: TableNames | None = None,
            engine: sa.Engine | None = None) -> None:
    names = names or db.names
    ReceiptApplier(engine or db.engine, table=names.outbox,
                   receipt_table_name=names.receipts).apply(receipts)


def remaining(db: Db) -> set[str]:
    t = tables(db).outbox
    with db.engine.connect() as conn:
        return set(conn.execute(sa.select(t.c.message_id)).scalars())


def test_archive_moves_rows_in_small_batches_with_a_pause_between_them(sqlite_db: Db) -> None:
    # Given 25 consumed rows
    ids = publish(sqlite_db, range(25))
    Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox).run_once()
    consume(sqlite_db, [Receipt(m, "inventory") for m in ids])
    # When they are archived 10 at a time with a 0.1 s pause
    started = time.monotonic()
    result = ops.archive(sqlite_db.engine, tables(sqlite_db), FAST, batch=10, pause=0.1,
                         now=utcnow() + dt.timedelta(seconds=1))
    # Then three batches moved them, with a pause after each full one
    assert (result.moved, result.batches) == (25, 3)
    assert time.monotonic() - started >= 0.2
    assert remaining(sqlite_db) == set()


def test_receipt_driven_archiving_waits_for_every_expected_group(
        db: Db, tmp_path: Path) -> None:
    # Given three consumed messages of topic T (every expected group answered for the first,
    # only inventory for the second: CONSUMED by the applier's any-one-group default) and one
    # of a topic the archiving does not name
    complete, partial = publish(db, range(2))
    (other,) = publish(db, range(1), topic="U")
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    consume(db, [Receipt(complete, "inventory"), Receipt(complete, "billing"),
                 Receipt(partial, "inventory"), Receipt(other, "inventory")])
    expect = {"T": ["inventory", "billing"]}
    later = utcnow() + dt.timedelta(seconds=1)
    # When receipt-driven archiving runs
    first = ops.archive(db.engine, tables(db), FAST, expect=expect, now=later)
    # Then only the message every expected group acknowledged moved
    assert first.moved == 1 and remaining(db) == {partial, other}
    # and once billing's receipt for the second is stored, it moves too
    consume(db, [Receipt(partial, "billing")])
    assert ops.archive(db.engine, tables(db), FAST, expect=expect, now=later).moved == 1
    assert remaining(db) == {other}


def test_receipt_driven_archiving_refuses_a_topic_given_one_string_of_groups(
        sqlite_db: Db) -> None:
    # Given a consumed message of topic T, and its expected group given as a bare string
    (mid,) = publish(sqlite_db, range(1))
    Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox).run_once()
    consume(sqlite_db, [Receipt(mid, "inventory")])
    later = utcnow() + dt.timedelta(seconds=1)
    # When archiving is asked for with it / Then it is refused, naming the topic (read as its
    # letters, it waited for groups 'i', 'n', 'v', ... and archived nothing, run after run)
    with pytest.raises(ConfigError, match="expect for topic 'T' must be a list"):
        ops.archive(sqlite_db.engine, tables(sqlite_db), FAST, expect={"T": "inventory"},
                    now=later)
    # and given as a list, the message moves
    assert ops.archive(sqlite_db.engine, tables(sqlite_db), FAST, expect={"T": ["inventory"]},
                       now=later).moved == 1


def test_the_archive_command_takes_a_pause_and_expected_groups(sqlite_db: Db) -> None:
    ids = publish(sqlite_db, range(3))
    Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox).run_once()
    consume(sqlite_db, [Receipt(m, g) for m in ids for g in ("a", "b")])
    time.sleep(0.01)  # the rows' last change must be older than --older-than 1ms
    result = CliRunner().invoke(app, [
        "outbox", "archive", "--url", sqlite_db.url, "--outbox-table", sqlite_db.names.outbox,
        "--receipt-table", sqlite_db.names.receipts, "--older-than", "1ms", "--pause", "1ms",
        "--batch", "2", "--expect", "T=a,b", "--json", "--force"])  # 1ms: under the floor
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["moved"] == 3


def test_archiving_under_the_safety_floor_needs_force_and_moves_nothing_without_it(
        sqlite_db: Db) -> None:
    # Given consumed rows, and a producer that may publish the same business event again
    ids = publish(sqlite_db, range(3))
    Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox).run_once()
    consume(sqlite_db, [Receipt(m, "a") for m in ids])
    time.sleep(0.01)
    args = ["outbox", "archive", "--url", sqlite_db.url, "--outbox-table",
            sqlite_db.names.outbox, "--receipt-table", sqlite_db.names.receipts,
            "--older-than", "1ms"]
    # When archived under the 7-day floor without --force
    refused = CliRunner().invoke(app, args)
    # Then one line, nothing moved: publish still answers the first message id
    assert refused.exit_code == 2
    assert "safety floor of 7 days" in error_line(refused.output)
    again = publish(sqlite_db, range(1))
    assert again == ids[:1]
    # And --force archives
    forced = CliRunner().invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "archived 3 rows" in forced.output


def test_the_processed_purge_deletes_the_oldest_rows_first_in_paced_batches(
        sqlite_db: Db) -> None:
    from consumer_kit.core.schema import processed_table
    from consumer_kit.processed import ProcessedStore

    # Given six processed rows of one group, processed 10 to 15 days ago, newest first by key
    p = processed_table(sa.MetaData(), sqlite_db.names.processed)
    now = utcnow()
    with sqlite_db.engine.begin() as conn:
        for i in range(6):
            at = now - dt.timedelta(days=10 + i)
            conn.execute(sa.insert(p).values(consumer_group="g", message_id=f"m{i}", topic="T",
                                             status="SUCCEEDED", attempts=1, first_seen_at=at,
                                             processed_at=at))
    store = ProcessedStore(sqlite_db.engine, "g", table=sqlite_db.names.processed)
    # When one batch of two is purged
    assert store.purge(dt.timedelta(days=7), batch=2, max_batches=1) == 2
    # Then the two oldest went
    with sqlite_db.engine.connect() as conn:
        left = set(conn.execute(sa.select(p.c.message_id)).scalars())
    assert left == {"m0", "m1", "m2", "m3"}
    # and the rest go in batches with a pause after each full one
    started = time.monotonic()
    assert store.purge(dt.timedelta(days=7), batch=2, pause=0.1) == 4
    assert time.monotonic() - started >= 0.2


# --- the day-partitioned outbox (MariaDB) ---------------------------------------------------

def ulid_at(moment: dt.datetime) -> str:
    return parts.ulid_floor(moment)[:10] + os.urandom(8).hex().upper()[:16].replace("I", "J")


@pytest.fixture
def partitioned(mariadb: Db) -> Iterator[tuple[Db, TableNames]]:
    names = unique_names("p")
    yield mariadb, names
    with mariadb.engine.begin() as conn:
        for table in (names.outbox, f"{names.outbox}_key", names.receipts,
                      names.outbox_archive):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")


def publish_at(db: Db, names: TableNames, moment: dt.datetime, key: str,
               monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr("outbox_producer.outbox.new_message_id", lambda: ulid_at(moment))
    outbox = Outbox(db.engine, producer="orders", table=names.outbox)
    with db.engine.begin() as conn:
        return outbox.publish(conn, "T", {"key": key}, biz_type="t", biz_key=key)


def count(db: Db, table: str) -> int:
    with db.engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar() or 0)


@pytest.mark.mariadb
def test_a_partitioned_outbox_publishes_once_per_key_and_drops_only_consumed_days(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    today = utcnow().date()
    days = [dt.datetime.combine(today - dt.timedelta(days=n), dt.time(12)) for n in (3, 2, 0)]
    # Given a partitioned outbox made three days ago
    made = parts.create(db.engine, ops.OutboxTables.from_names(names), days_ahead=3,
                        today=today - dt.timedelta(days=3))
    assert made[0] == parts.day_name(today - dt.timedelta(days=3)) and made[-1] == "pmax"
    # and messages published three days ago, two days ago and today
    old = [publish_at(db, names, days[0], f"a{i}", monkeypatch) for i in range(3)]
    middle = [publish_at(db, names, days[1], f"b{i}", monkeypatch) for i in range(2)]
    new = publish_at(db, names, days[2], "c0", monkeypatch)
    # When a key published three days ago is published again today
    again = publish_at(db, names, days[2], "a0", monkeypatch)
    # Then the first message id comes back (the key table spans every partition)
    assert again == old[0]
    # Given every message sent and all but one consumed
    Relay(db.engine, RecordingTransport(), table=names.outbox).run_once()
    consume(db, [Receipt(m, "inventory") for m in [*old, middle[0], new]], names=names)
    # When they rotate keeping 100 years (the horizon before 1970), nothing is dropped
    kept_all = parts.rotate(db.engine, ops.OutboxTables.from_names(names), days_ahead=2,
                            older_than=dt.timedelta(days=36525))
    assert kept_all.dropped == [] and kept_all.archived == 0
    # When the partitions rotate, retiring days that ended a day ago
    result = parts.rotate(db.engine, ops.OutboxTables.from_names(names), days_ahead=2,
                          older_than=dt.timedelta(days=1))
    # Then the day whose rows are all CONSUMED was archived and dropped, the day with a SENT
    # row kept, and partitions exist two days ahead
    assert result.dropped == [parts.day_name(today - dt.timedelta(days=3))]
    assert result.kept == {parts.day_name(today - dt.timedelta(days=2)): "rows not yet CONSUMED"}
    assert result.archived == 3 and count(db, names.outbox_archive) == 3
    names_now = [p.name for p in parts.partitions(db.engine, names.outbox)]
    assert parts.day_name(today + dt.timedelta(days=2)) in names_now
    assert parts.day_name(today - dt.timedelta(days=3)) not in names_now
    # and the dropped day's receipt and key rows are gone, the others kept
    assert count(db, names.receipts) == 2 and count(db, f"{names.outbox}_key") == 3
    # and a rotation again changes nothing
    assert parts.rotate(db.engine, ops.OutboxTables.from_names(names), days_ahead=2,
                        older_than=dt.timedelta(days=1)).dropped == []


@pytest.mark.mariadb
def test_partitions_show_and_refusals_are_one_line(
        partitioned: tuple[Db, TableNames], sqlite_db: Db) -> None:
    db, names = partitioned
    runner = CliRunner()
    common: list[Any] = ["--url", db.url, "--outbox-table", names.outbox, "--receipt-table",
                         names.receipts]
    assert runner.invoke(app, ["outbox", "partitions", "create", *common]).exit_code == 0
    shown = runner.invoke(app, ["outbox", "partitions", "show", "--url", db.url,
                                "--outbox-table", names.outbox, "--json"])
    assert [p["name"] for p in json.loads(shown.output)][-1] == "pmax"
    again = runner.invoke(app, ["outbox", "partitions", "create", *common])
    assert again.exit_code == 2 and f"table {names.outbox} exists" in again.output
    for command in ("rotate", "show"):  # show said "no such table: information_schema..."
        on_sqlite = runner.invoke(app, ["outbox", "partitions", command, "--url",
                                        sqlite_db.url])
        assert on_sqlite.exit_code == 2 and "needs MySQL or MariaDB" in on_sqlite.output
    # and show refuses a table that is missing or not partitioned (it printed an empty table
    # and exited 0)
    for table, why in (("ckit_no_such_table", "missing"), (names.receipts, "not partitioned")):
        shown = runner.invoke(app, ["outbox", "partitions", "show", "--url", db.url,
                                    "--outbox-table", table])
        assert shown.exit_code == 2 and why in shown.output, shown.output


def consumed_day(db: Db, names: TableNames, monkeypatch: pytest.MonkeyPatch, days_ago: int,
                 keys: tuple[str, ...]) -> list[str]:
    """A partitioned outbox made `days_ago` days ago, `keys` published at noon that day, sent
    and consumed: their message ids."""
    today = utcnow().date()
    parts.create(db.engine, ops.OutboxTables.from_names(names), days_ahead=days_ago,
                 today=today - dt.timedelta(days=days_ago))
    noon = dt.datetime.combine(today - dt.timedelta(days=days_ago), dt.time(12))
    ids = [publish_at(db, names, noon, key, monkeypatch) for key in keys]
    Relay(db.engine, RecordingTransport(), table=names.outbox).run_once()
    consume(db, [Receipt(m, "inventory") for m in ids], names=names)
    return ids


@pytest.mark.mariadb
def test_a_day_the_last_check_keeps_keeps_its_key_and_receipt_rows(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    tables = ops.OutboxTables.from_names(names)
    first, second = consumed_day(db, names, monkeypatch, 3, ("order-1", "order-2"))
    day = parts.day_name(utcnow().date() - dt.timedelta(days=3))
    # Given an operator re-sends order-2 while rotate copies its day to the archive
    copy = parts._copy_to_archive

    def copy_then_retry(*args: Any) -> int:
        copied = copy(*args)
        if args[2] == day:
            assert ops.retry(db.engine, tables, [f"msg:{second}"], force=True).changed
        return copied

    monkeypatch.setattr(parts, "_copy_to_archive", copy_then_retry)
    # When the day is rotated
    result = parts.rotate(db.engine, tables, days_ahead=0, older_than=dt.timedelta(days=1))
    # Then it is kept with its rows, its key rows and order-1's receipt
    assert day in result.kept and day not in result.dropped
    assert count(db, names.outbox) == 2
    assert count(db, f"{names.outbox}_key") == 2 and count(db, names.receipts) == 1
    # and order-1, still in the outbox, is not published a second time
    assert publish_at(db, names, utcnow(), "order-1", monkeypatch) == first


def metadata_lock_waited(db: Db, table: str) -> bool:
    """Whether a session waits for `table`'s metadata lock (DROP PARTITION, LOCK TABLES, or a
    publish behind them)."""
    with db.engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE STATE LIKE "
            "'Waiting for table metadata lock%' AND INFO LIKE :t"),
            {"t": f"%{table}%"}).first() is not None


def poll(condition: Callable[[], bool], within: float = 10.0) -> None:
    """Return once `condition()` holds, or after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def late_publisher(db: Db, names: TableNames, monkeypatch: pytest.MonkeyPatch,
                   commit_when: Callable[[], bool]) -> tuple[threading.Thread, threading.Event,
                                                             list[str]]:
    """A business transaction that publishes `k-late` at yesterday's last second and commits
    once `commit_when()` holds: its thread (not started), an event set once its row is
    inserted, and the list its message id goes into."""
    last_second = dt.datetime.combine(utcnow().date(), dt.time()) - dt.timedelta(seconds=1)
    monkeypatch.setattr("outbox_producer.outbox.new_message_id", lambda: ulid_at(last_second))
    inserted, late = threading.Event(), []

    def business_transaction() -> None:
        outbox = Outbox(db.engine, producer="orders", table=names.outbox)
        with db.engine.begin() as conn:
            late.append(outbox.publish(conn, "T", {"key": "k-late"}, biz_type="t",
                                       biz_key="k-late"))
            inserted.set()
            poll(commit_when)

    return threading.Thread(target=business_transaction), inserted, late


def pending(db: Db, names: TableNames, message_id: str) -> bool:
    t = ops.OutboxTables.from_names(names).outbox
    with db.engine.connect() as conn:
        state = conn.execute(sa.select(t.c.state).where(t.c.message_id == message_id)).scalar()
    return state == int(OutboxState.PENDING)


@dataclasses.dataclass
class ConsumedYesterday:
    """A partitioned outbox whose yesterday holds one CONSUMED row (`k-consumed`)."""

    db: Db
    names: TableNames
    tables: ops.OutboxTables
    day: str  # yesterday's partition

    def rotate(self) -> parts.RotateResult:
        """`rotate --older-than 0`: retire yesterday, add no day."""
        return parts.rotate(self.db.engine, self.tables, days_ahead=0,
                            older_than=dt.timedelta(0))


@pytest.fixture
def yesterday(partitioned: tuple[Db, TableNames],
              monkeypatch: pytest.MonkeyPatch) -> ConsumedYesterday:
    db, names = partitioned
    consumed_day(db, names, monkeypatch, 1, ("k-consumed",))
    return ConsumedYesterday(db, names, ops.OutboxTables.from_names(names),
                             parts.day_name(utcnow().date() - dt.timedelta(days=1)))


@pytest.mark.mariadb
def test_a_publish_open_when_rotate_retires_its_day_keeps_the_day_and_its_keys(
        yesterday: ConsumedYesterday, monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = yesterday.db, yesterday.names
    # Given a publish at yesterday's last second whose transaction, open while rotate copies
    # the day, commits only once rotate waits for the outbox's metadata lock
    business, inserted, late = late_publisher(
        db, names, monkeypatch, lambda: metadata_lock_waited(db, names.outbox))
    copy = parts._copy_to_archive

    def copy_then_publish(*args: Any) -> int:
        copied = copy(*args)
        business.start()
        assert inserted.wait(10)
        return copied

    monkeypatch.setattr(parts, "_copy_to_archive", copy_then_publish)
    # When rotate retires yesterday
    result = yesterday.rotate()
    business.join(20)
    # Then the day is kept with the late PENDING row and both key rows
    assert yesterday.day in result.kept and result.dropped == []
    assert pending(db, names, late[0])
    assert count(db, f"{names.outbox}_key") == 2


@pytest.mark.mariadb
def test_a_publish_committed_into_the_day_after_its_copy_keeps_the_day_without_failing(
        yesterday: ConsumedYesterday, monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = yesterday.db, yesterday.names
    # Given a publish at yesterday's last second committed right after rotate copied the day
    business, _inserted, late = late_publisher(db, names, monkeypatch, lambda: True)
    copy = parts._copy_to_archive

    def copy_then_publish(*args: Any) -> int:
        copied = copy(*args)
        business.start()
        business.join(10)
        return copied

    monkeypatch.setattr(parts, "_copy_to_archive", copy_then_publish)
    # When rotate retires yesterday, Then it keeps the day, saying why, and does not fail
    result = yesterday.rotate()
    assert result.dropped == [] and "not in the archive yet" in result.kept[yesterday.day]
    assert pending(db, names, late[0])
    assert count(db, f"{names.outbox}_key") == 2


@pytest.mark.mariadb
def test_rotate_waits_a_bounded_time_for_a_busy_outbox_and_keeps_the_day_for_the_next_run(
        yesterday: ConsumedYesterday, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "LOCK_WAIT_SECONDS", 1)
    # Given a long transaction that read the outbox and stays open
    with yesterday.db.engine.connect() as long_tx:
        long_tx.exec_driver_sql(f"SELECT COUNT(*) FROM {yesterday.names.outbox}").all()
        started = time.monotonic()
        # When rotate retires yesterday
        result = yesterday.rotate()
        waited = time.monotonic() - started
        long_tx.rollback()
    # Then it waited about the bound (the server's own wait is a year), and kept the day
    assert waited < parts.LOCK_WAIT_SECONDS + 5
    assert result.dropped == [] and "stayed busy" in result.kept[yesterday.day]
    # and the next run, the transaction gone, drops it
    assert yesterday.day in yesterday.rotate().dropped


@pytest.mark.mariadb
def test_a_publish_racing_the_final_check_is_never_dropped_with_the_day(
        yesterday: ConsumedYesterday, monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = yesterday.db, yesterday.names
    # Given a publish at yesterday's last second that starts right after rotate's final check
    # of the day and commits once rotate waits for the outbox (or is done)
    rotated = threading.Event()
    business, inserted, late = late_publisher(
        db, names, monkeypatch,
        lambda: rotated.is_set() or metadata_lock_waited(db, names.outbox))
    check, checks = parts._open_rows, []

    def check_then_publish(*args: Any) -> bool:
        found = check(*args)
        checks.append(found)
        if len(checks) == 2:  # the final check: the publish inserts, or waits for rotate
            business.start()
            poll(lambda: inserted.is_set() or metadata_lock_waited(db, names.outbox))
        return found

    monkeypatch.setattr(parts, "_open_rows", check_then_publish)
    # When rotate retires yesterday
    yesterday.rotate()
    rotated.set()
    business.join(20)
    # Then the late row is in the outbox, PENDING, with its key row
    assert pending(db, names, late[0])
    assert count(db, f"{names.outbox}_key") == 1


@pytest.mark.mariadb
def test_rotating_under_the_safety_floor_needs_force_and_drops_nothing_without_it(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    (first,) = consumed_day(db, names, monkeypatch, 3, ("order-42",))
    day = parts.day_name(utcnow().date() - dt.timedelta(days=3))
    args = ["outbox", "partitions", "rotate", "--url", db.url, "--outbox-table", names.outbox,
            "--receipt-table", names.receipts, "--days-ahead", "0"]
    runner = CliRunner()
    # When rotated with the defaults, the 3-day-old day stays (the default is the 7-day floor)
    by_default = runner.invoke(app, args)
    assert by_default.exit_code == 0, by_default.output
    assert "dropped none" in by_default.output
    # When rotated 1 day back without --force: one line, nothing dropped
    refused = runner.invoke(app, [*args, "--older-than", "1d"])
    assert refused.exit_code == 2
    assert "safety floor of 7 days" in error_line(refused.output)
    assert day in [p.name for p in parts.partitions(db.engine, names.outbox)]
    assert publish_at(db, names, utcnow(), "order-42", monkeypatch) == first
    # And --force drops the day
    forced = runner.invoke(app, [*args, "--older-than", "1d", "--force"])
    assert forced.exit_code == 0, forced.output
    assert day in forced.output.split(";")[1]


@pytest.mark.mariadb
def test_archiving_a_partitioned_outbox_frees_the_keys_of_the_rows_it_moved(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    tables = ops.OutboxTables.from_names(names)
    moved, kept = consumed_day(db, names, monkeypatch, 10, ("order-9", "order-10"))
    # Given order-9 consumed 10 days ago and order-10 retried since
    assert ops.retry(db.engine, tables, [f"msg:{kept}"], force=True).changed
    ten_days_ago = utcnow() - dt.timedelta(days=10)
    with db.engine.begin() as conn:
        conn.execute(sa.update(tables.outbox).where(tables.outbox.c.message_id == moved)
                     .values(gmt_create=ten_days_ago, gmt_modified=ten_days_ago))
    # When the outbox is archived at the floor
    assert ops.archive(db.engine, tables, ops.ARCHIVE_FLOOR).moved == 1
    # Then order-9's key row went with its row, and order-9 publishes again as it would on an
    # unpartitioned outbox (not an IntegrityError on the key table)
    assert count(db, f"{names.outbox}_key") == 1
    assert publish_at(db, names, utcnow(), "order-9", monkeypatch) != moved
    # while order-10, still in the outbox, answers its first message id
    assert publish_at(db, names, utcnow(), "order-10", monkeypatch) == kept


@pytest.mark.mariadb
def test_rotate_deletes_the_key_and_receipt_rows_a_dropped_day_left_behind(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    (first,) = consumed_day(db, names, monkeypatch, 3, ("order-1",))
    today = utcnow().date()
    # Given the next day kept by a PENDING row
    publish_at(db, names, dt.datetime.combine(today - dt.timedelta(days=2), dt.time(12)),
               "order-2", monkeypatch)
    # and the day before dropped with its key and receipt rows left (a rotate that died
    # between its DROP PARTITION and its deletes)
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {names.outbox} DROP PARTITION "
                             f"{parts.day_name(today - dt.timedelta(days=3))}")
    # Then publishing its key again fails on the key table: never a second send
    with pytest.raises(sa.exc.IntegrityError):
        publish_at(db, names, utcnow(), "order-1", monkeypatch)
    # When rotate runs again
    result = parts.rotate(db.engine, ops.OutboxTables.from_names(names), days_ahead=0,
                          older_than=dt.timedelta(days=1))
    # Then the rows left behind are gone, the kept day's key row stays, and the key publishes
    # as a new event
    assert result.kept == {parts.day_name(today - dt.timedelta(days=2)): "rows not yet CONSUMED"}
    assert count(db, f"{names.outbox}_key") == 1 and count(db, names.receipts) == 0
    assert publish_at(db, names, utcnow(), "order-1", monkeypatch) != first
