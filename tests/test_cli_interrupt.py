"""Ctrl-C during a batch command: one line saying what stays committed.

`ckit outbox archive` or `ckit processed purge` interrupted between batches exited 130 without
a word (typer turns KeyboardInterrupt into a silent exit): the operator could not tell that
rows had moved. Now the line names the batches committed before the interrupt, as for an
error (`core.progress`), and the exit code stays 130.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import Result

import consumer_kit.processed
import outbox_producer.ops.archiving
from consumer_kit.core.clock import utcnow
from consumer_kit.core.states import OutboxState
from outbox_producer import ops
from tests.cli import invoke, without_ckit_env
from tests.conftest import Db

OLD = utcnow() - dt.timedelta(days=40)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    without_ckit_env(monkeypatch)


ckit = invoke


class _InterruptedTime:
    """The `time` module as one module sees it, whose `sleep` is Ctrl-C. (Patching
    `time.sleep` itself raised KeyboardInterrupt in every thread that slept meanwhile: a
    py4j finalizer left by the Spark tests failed the test.)"""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds: float) -> None:
        raise KeyboardInterrupt


def interrupt_at_first_pause(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """Ctrl-C lands in `module`'s pause after the first batch (that batch is committed)."""
    monkeypatch.setattr(module, "time", _InterruptedTime())


def assert_interrupted_after(result: Result, done: str) -> None:
    assert result.exit_code == 130, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0] == (f"error: interrupted (after {done}: that stays committed; running the "
                        "command again goes on from there)")


def test_an_archive_interrupted_after_a_batch_says_what_it_moved(
        db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given three consumed rows older than the horizon
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.begin() as conn:
        for _ in range(3):
            conn.execute(sa.insert(outbox).values(
                message_id=f"m-{uuid.uuid4().hex}", biz_type="order",
                biz_key=f"k-{uuid.uuid4().hex[:8]}", topic="ORDERS", body=b"{}",
                state=int(OutboxState.CONSUMED), next_retry_at=OLD, gmt_create=OLD,
                gmt_modified=OLD))
    interrupt_at_first_pause(monkeypatch, outbox_producer.ops.archiving)
    # When the archive, one row a batch, is interrupted after its first batch
    result = ckit("outbox", "archive", "--url", db.url, "--outbox-table", db.names.outbox,
                  "--receipt-table", db.names.receipts, "--batch", "1", "--pause", "1s")
    # Then its line says the row it archived (it exited 130 without a word)
    assert_interrupted_after(result, "1 row archived in 1 batch")
    assert db.count(db.names.outbox) == 2


def test_a_processed_purge_interrupted_after_a_batch_says_what_it_deleted(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    table = consumer_kit.processed.ProcessedStore(
        sqlite_db.engine, "billing", table=sqlite_db.names.processed).table
    with sqlite_db.engine.begin() as conn:
        for _ in range(3):
            conn.execute(sa.insert(table).values(
                consumer_group="billing", message_id=f"m-{uuid.uuid4().hex}", topic="ORDERS",
                status="DONE", first_seen_at=OLD, processed_at=OLD))
    interrupt_at_first_pause(monkeypatch, consumer_kit.processed)
    result = ckit("processed", "purge", "--url", sqlite_db.url, "--processed-table",
                  sqlite_db.names.processed, "--group", "billing", "--batch", "1",
                  "--pause", "1s")
    assert_interrupted_after(result, "1 processed row deleted in 1 batch")
    assert sqlite_db.count(sqlite_db.names.processed) == 2


def test_an_interrupt_before_any_batch_is_one_line(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    def stats(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(ops, "stats", stats)
    result = ckit("outbox", "stats", "--url", sqlite_db.url, "--outbox-table",
                  sqlite_db.names.outbox)
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines() == ["error: interrupted"]
