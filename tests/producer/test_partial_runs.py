"""A batch command that fails part way says what it committed and exits 1, not 2 ("nothing was
done"): the processed purge, the archive and the partition rotation, each stopped by a real
database error (a trigger refusing one row) after its first batches committed."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import Result
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.cli.runtime import EXIT_FAILURE, EXIT_USAGE
from consumer_kit.core.clock import utcnow
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.schema import TableNames, processed_table
from outbox_producer import Relay
from outbox_producer.ops import archiving
from outbox_producer.ops import partitions as parts
from tests.cli import error_line
from tests.conftest import Db
from tests.poison import POISON, refused
from tests.producer.test_retention import consume, consumed_day, count, publish, remaining
from tests.producer.test_retention import partitioned as partitioned  # the fixture
from tests.recording import RecordingTransport


def processed_rows(db: Db, n: int) -> list[str]:
    """`n` processed rows of group g, processed 10+ days ago, oldest last: their ids in purge
    order (oldest first)."""
    p = processed_table(sa.MetaData(), db.names.processed)
    now = utcnow()
    with db.engine.begin() as conn:
        for i in range(n):
            at = now - dt.timedelta(days=10 + i)
            conn.execute(sa.insert(p).values(consumer_group="g", message_id=f"m{i}", topic="T",
                                             status="SUCCEEDED", attempts=1, first_seen_at=at,
                                             processed_at=at))
    return [f"m{i}" for i in reversed(range(n))]


def processed_left(db: Db) -> set[str]:
    p = processed_table(sa.MetaData(), db.names.processed)
    with db.engine.connect() as conn:
        return set(conn.execute(sa.select(p.c.message_id)).scalars())


def purge_args(db: Db) -> list[str]:
    return ["processed", "purge", "--url", db.url, "--group", "g", "--processed-table",
            db.names.processed, "--batch", "2"]


def purge_refusing(db: Db, rows: int, refused_at: int) -> tuple[Result, list[str]]:
    """`ckit processed purge` two rows a batch over `rows` old rows, the database refusing to
    delete the `refused_at`-th oldest: its result, and the ids in purge order."""
    order = processed_rows(db, rows)
    with refused(db.engine, db.names.processed, "DELETE", "message_id", order[refused_at]):
        return CliRunner().invoke(app, purge_args(db)), order


def test_a_purge_failing_after_two_batches_says_what_it_deleted_and_exits_1(db: Db) -> None:
    # Given six old processed rows, purged two at a time, and the database refusing to delete
    # the fifth oldest; When the purge runs
    result, order = purge_refusing(db, 6, 4)
    # Then it fails with the database's error, says the first two batches stay deleted, and
    # exits 1: not 2, which says nothing was done
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert "database error" in line and POISON in line
    assert "after 4 processed rows deleted in 2 batches: that stays committed" in line
    assert processed_left(db) == set(order[4:])


def test_a_purge_failing_in_its_first_batch_still_says_nothing_was_done(db: Db) -> None:
    result, order = purge_refusing(db, 4, 0)
    assert result.exit_code == EXIT_USAGE, result.output
    line = error_line(result.output)
    assert POISON in line and "after" not in line
    assert processed_left(db) == set(order)


def consumed(db: Db, n: int) -> list[str]:
    """`n` CONSUMED outbox rows, in id order."""
    ids = publish(db, range(n))
    Relay(db.engine, RecordingTransport(), table=db.names.outbox).run_once()
    consume(db, [Receipt(m, "inventory") for m in ids])
    time.sleep(0.01)  # their last change older than --older-than 1ms
    return ids


def archive_args(db: Db) -> list[str]:
    return ["outbox", "archive", "--url", db.url, "--outbox-table", db.names.outbox,
            "--receipt-table", db.names.receipts, "--older-than", "1ms", "--force",
            "--batch", "2"]


def test_an_archive_failing_in_its_second_batch_says_what_it_moved_and_exits_1(db: Db) -> None:
    # Given five consumed rows archived two at a time, and the third one's delete refused
    ids = consumed(db, 5)
    with refused(db.engine, db.names.outbox, "DELETE", "message_id", ids[2]):
        # When they are archived
        result = CliRunner().invoke(app, archive_args(db))
    # Then the first batch stays archived, the failed batch rolled back whole, and the line
    # says so with exit 1
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert POISON in line and "after 2 rows archived in 1 batch:" in line
    assert remaining(db) == set(ids[2:])
    assert count(db, db.names.outbox_archive) == 2
    # and run again without the fault, it goes on from there
    again = CliRunner().invoke(app, archive_args(db))
    assert again.exit_code == 0, again.output
    assert remaining(db) == set() and count(db, db.names.outbox_archive) == 5


def test_an_archive_failing_in_its_first_batch_exits_2(db: Db) -> None:
    ids = consumed(db, 3)
    with refused(db.engine, db.names.outbox, "DELETE", "message_id", ids[0]):
        result = CliRunner().invoke(app, archive_args(db))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "after" not in error_line(result.output)
    assert remaining(db) == set(ids)


@pytest.mark.mariadb
def test_a_rotation_failing_while_it_copies_a_day_says_what_it_copied(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    # Given a consumed day three days back, copied to the archive one row per batch, and the
    # archive refusing its second row
    ids = consumed_day(db, names, monkeypatch, 3, ("a", "b", "c"))
    day = parts.day_name(utcnow().date() - dt.timedelta(days=3))
    with refused(db.engine, names.outbox_archive, "INSERT", "message_id", ids[1]):
        # When the partitions rotate
        result = CliRunner().invoke(app, [
            "outbox", "partitions", "rotate", "--url", db.url, "--outbox-table", names.outbox,
            "--receipt-table", names.receipts, "--days-ahead", "0", "--older-than", "1d",
            "--force", "--batch", "1"])
    # Then the line says the first row was copied, exit 1, and the day is still there
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert POISON in line and "after 1 row copied to the archive:" in line
    assert count(db, names.outbox_archive) == 1
    assert day in [p.name for p in parts.partitions(db.engine, names.outbox)]


@pytest.mark.mariadb
def test_an_archive_whose_lock_connection_is_killed_still_says_what_it_moved(
        mariadb: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given six consumed rows archived two at a time, the fifth refused, and the connection
    # holding the run's lock killed after the first batch (a server restart, a DBA's KILL)
    db = mariadb
    ids = consumed(db, 6)
    batch = archiving._archive_batch
    calls: list[int] = []

    def batch_then_kill_the_lock(*args: Any) -> tuple[int, int]:
        if len(calls) == 1:
            with db.engine.begin() as conn:
                holder = conn.scalar(sa.text("SELECT IS_USED_LOCK(:n)"), {
                    "n": f"ckit_archive:{db.engine.url.database}.{db.names.outbox}"})
                conn.exec_driver_sql(f"KILL CONNECTION {int(holder)}")
        calls.append(1)
        return batch(*args)

    monkeypatch.setattr(archiving, "_archive_batch", batch_then_kill_the_lock)
    with refused(db.engine, db.names.outbox, "DELETE", "message_id", ids[4]):
        # When they are archived (the lock's release fails too, after the batch's error)
        result = CliRunner().invoke(app, archive_args(db))
    # Then the line still says what stays archived, with exit 1
    assert result.exit_code == EXIT_FAILURE, result.output
    assert "after 4 rows archived in 2 batches:" in error_line(result.output)
    assert remaining(db) == set(ids[4:])


@pytest.mark.mariadb
def test_a_rotation_failing_while_it_sweeps_old_receipts_says_what_it_deleted(
        partitioned: tuple[Db, TableNames], monkeypatch: pytest.MonkeyPatch) -> None:
    db, names = partitioned
    # Given a partitioned outbox, three receipt rows below its first day (their days dropped
    # by an earlier run), swept one per batch, and the second refused
    consumed_day(db, names, monkeypatch, 3, ("a",))
    receipts = sa.table(names.receipts, sa.column("message_id"), sa.column("consumer_group"),
                        sa.column("outcome"), sa.column("received_at"))
    with db.engine.begin() as conn:
        conn.execute(sa.insert(receipts), [
            {"message_id": f"00ORPHAN{i}", "consumer_group": "inventory",
             "outcome": "consumed", "received_at": utcnow()} for i in range(3)])
    with refused(db.engine, names.receipts, "DELETE", "message_id", "00ORPHAN1"):
        # When the partitions rotate (keeping every day)
        result = CliRunner().invoke(app, [
            "outbox", "partitions", "rotate", "--url", db.url, "--outbox-table", names.outbox,
            "--receipt-table", names.receipts, "--days-ahead", "0", "--batch", "1"])
    # Then the line says the first was deleted, with exit 1
    assert result.exit_code == EXIT_FAILURE, result.output
    assert "after 1 receipt or key row deleted:" in error_line(result.output)
