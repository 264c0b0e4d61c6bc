"""The reconciler end to end, on SQLite and MariaDB, with the SQL and the Spark engine.

Every class of DESIGN.md is produced on purpose and every repair is checked row by row.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile import EXIT_ALERT, EXIT_OK, RepairClass, run_reconcile
from consumer_kit.reconcile.model import Thresholds
from consumer_kit.reconcile.repair import RepairApplier
from tests.reconcile.conftest import OLD, RECENT, World


def _seed_every_class(w: World) -> dict[str, str]:
    ids = {
        "receipt_lost": w.add_outbox(OutboxState.SENT),
        "rejected": w.add_outbox(OutboxState.SENT),
        "retry": w.add_outbox(OutboxState.SENT, retry_count=1, max_retries=3),
        "exhausted": w.add_outbox(OutboxState.SENT, retry_count=3, max_retries=3),
        "stuck_sending": w.add_outbox(OutboxState.SENDING, age=OLD, lease_age=OLD),
        # Outside the window: must not be touched.
        "recent_sent": w.add_outbox(OutboxState.SENT, age=RECENT),
        "old_consumed": w.add_outbox(OutboxState.CONSUMED),
        "live_lease": w.add_outbox(OutboxState.SENDING, lease_age=-RECENT),
    }
    w.add_processed("inventory", ids["receipt_lost"], "SUCCEEDED")
    w.add_processed("inventory", ids["rejected"], "FAILED", error="ValidationError: no sku")
    w.add_processed("inventory", ids["recent_sent"], "SUCCEEDED", age=RECENT)
    w.add_processed("inventory", ids["old_consumed"], "SUCCEEDED")
    ids["orphan"] = "m-orphan-without-outbox"
    w.add_processed("inventory", ids["orphan"], "SUCCEEDED", age=dt.timedelta(minutes=30))
    return ids


def test_every_class_is_found_and_repaired_row_by_row(world: World, engine_name: str) -> None:
    # Given one row of every class, rows outside the window, and an orphan processed row
    ids = _seed_every_class(world)
    before = {k: world.row(v) for k, v in ids.items() if k != "orphan"}

    # When the reconciler runs
    summary = run_reconcile(world.config(engine_name))

    # Then each class is counted and repaired as DESIGN.md says
    found = {k.value: c.found for k, c in summary.classes.items()}
    assert found == {"receipt_lost": 1, "rejected": 1, "retry": 1, "exhausted": 1,
                     "stuck_sending": 1, "beyond_dedupe": 0, "unmatched": 0, "orphan": 1}
    assert summary.conflicts == 0
    now = world.now

    receipt_lost = world.row(ids["receipt_lost"])
    assert (receipt_lost.state, receipt_lost.consumed_at) == (OutboxState.CONSUMED, now)
    assert world.receipts_of(ids["receipt_lost"]) == {"inventory": "consumed"}

    rejected = world.row(ids["rejected"])
    assert rejected.state == OutboxState.REJECTED
    assert rejected.fail_reason == "inventory: ValidationError: no sku"

    retry = world.row(ids["retry"])
    assert (retry.state, retry.retry_count, retry.next_retry_at) == (OutboxState.PENDING, 2, now)
    assert "not consumed by inventory" in retry.fail_reason

    exhausted = world.row(ids["exhausted"])
    assert (exhausted.state, exhausted.retry_count) == (OutboxState.FAILED, 3)
    assert exhausted.fail_reason.startswith("reconciler: not consumed by inventory after 3")

    stuck = world.row(ids["stuck_sending"])
    assert (stuck.state, stuck.lease_owner, stuck.lease_until, stuck.next_retry_at) == (
        OutboxState.PENDING, None, None, now)

    for key in ("receipt_lost", "rejected", "retry", "exhausted", "stuck_sending"):
        row = world.row(ids[key])
        assert row.lock_version == before[key].lock_version + 1, key
        assert (row.updated_by, row.gmt_modified) == ("reconciler", now), key
    for key in ("recent_sent", "old_consumed", "live_lease"):
        assert world.row(ids[key]) == before[key], key

    assert [s["message_id"] for s in summary.samples[RepairClass.ORPHAN]] == [ids["orphan"]]
    assert summary.exit_code == EXIT_ALERT  # rejected and exhausted are failure classes


def test_rerun_changes_nothing(world: World, engine_name: str) -> None:
    # Given a reconciled world
    _seed_every_class(world)
    first = run_reconcile(world.config(engine_name))
    assert first.classes[RepairClass.RECEIPT_LOST].applied == 1
    snapshot = world.snapshot()

    # When the reconciler runs again
    second = run_reconcile(world.config(engine_name))

    # Then nothing is found to repair and no row changed (orphans are still reported)
    assert second.window_rows == 0
    assert second.statements == 0
    assert second.classes[RepairClass.ORPHAN].found == 1
    assert world.snapshot() == snapshot


def test_dry_run_writes_nothing_but_reports_what_it_would_do(
        world: World, engine_name: str, tmp_path: Path) -> None:
    # Given stuck rows
    _seed_every_class(world)
    snapshot = world.snapshot()

    # When a dry run reconciles, alerting on any conflict
    summary = run_reconcile(world.config(
        engine_name, dry_run=True, output_dir=tmp_path / "out",
        thresholds=Thresholds(conflicts=0, fail_on_failures=False)))

    # Then it counts intended repairs, applies none, and the database is unchanged
    assert summary.classes[RepairClass.RETRY].intended == 1
    assert sum(c.applied for c in summary.classes.values()) == 0
    assert summary.statements == 0
    assert world.snapshot() == snapshot
    data = json.loads((Path(summary.output_dir or "") / "summary.json").read_text())
    assert data["dry_run"] is True and data["classes"]["retry"]["intended"] == 1
    # And the repairs it did not try are no conflicts (they used to be, and alerted)
    assert summary.conflicts == 0 and data["classes"]["retry"]["conflicts"] == 0
    assert data["conflicts"] == 0 and summary.alerts == [] and summary.exit_code == EXIT_OK


def test_row_changed_between_read_and_write_is_a_conflict_not_overwritten(
        world: World, engine_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two ack-lost rows; the ack applier marks one CONSUMED after the read (same target
    # state and lock_version + 1: only the fingerprint tells it was not us)
    moved = world.add_outbox(OutboxState.SENT)
    kept = world.add_outbox(OutboxState.SENT)
    for m in (moved, kept):
        world.add_processed("inventory", m, "SUCCEEDED")
    original = RepairApplier._apply

    def concurrent_writer_first(self: RepairApplier, key: Any, batch: Any) -> None:
        with world.producer.begin() as conn:
            conn.execute(sa.update(world.outbox).where(world.outbox.c.message_id == moved)
                         .values(state=int(OutboxState.CONSUMED), fail_reason="by acks",
                                 lock_version=world.outbox.c.lock_version + 1,
                                 updated_by="acks"))
        original(self, key, batch)

    monkeypatch.setattr(RepairApplier, "_apply", concurrent_writer_first)

    # When the reconciler applies its repairs
    summary = run_reconcile(world.config(engine_name, orphan_window=dt.timedelta(0)))

    # Then the moved row keeps the other writer's change and counts as a conflict
    count = summary.classes[RepairClass.RECEIPT_LOST]
    assert (count.intended, count.applied, count.conflicts) == (2, 1, 1)
    assert [c["message_id"] for c in summary.conflict_samples] == [moved]
    row = world.row(moved)
    assert (row.state, row.updated_by, row.fail_reason) == (OutboxState.CONSUMED, "acks", "by acks")
    assert world.receipts_of(moved) == {}
    assert world.row(kept).state == OutboxState.CONSUMED
    assert world.receipts_of(kept) == {"inventory": "consumed"}


def test_two_groups_one_missing_ack_is_resent_and_all_acked_is_consumed(
        world2: World, engine_name: str) -> None:
    # Given two groups in two databases
    w = world2
    both = w.add_outbox(OutboxState.SENT)
    only_inventory = w.add_outbox(OutboxState.SENT, retry_count=0)
    acked_and_processed = w.add_outbox(OutboxState.SENT)
    for m in (both, only_inventory):
        w.add_processed("inventory", m, "SUCCEEDED")
    w.add_processed("billing", both, "SUCCEEDED")
    w.add_ack(acked_and_processed, "inventory")          # its processed row was purged
    w.add_processed("billing", acked_and_processed, "SUCCEEDED")

    # When the reconciler runs
    summary = run_reconcile(w.config(engine_name, orphan_window=dt.timedelta(0)))

    # Then a message acked by every group is CONSUMED with the missing ack rows inserted
    assert w.row(both).state == OutboxState.CONSUMED
    assert w.receipts_of(both) == {"inventory": "consumed", "billing": "consumed"}
    assert w.row(acked_and_processed).state == OutboxState.CONSUMED
    assert w.receipts_of(acked_and_processed) == {"inventory": "consumed", "billing": "consumed"}
    assert summary.receipts_inserted == 3
    # and the one billing never processed is re-sent (inventory will dedupe it)
    row = w.row(only_inventory)
    assert (row.state, row.retry_count) == (OutboxState.PENDING, 1)
    assert "not consumed by billing" in row.fail_reason
    assert summary.samples[RepairClass.RETRY][0]["groups_missing"] == ["billing"]


def test_a_group_that_rejected_then_processed_a_re_send_is_consumed_its_receipt_replaced(
        world: World, engine_name: str) -> None:
    # Given a message inventory rejected, was made to run again (an operator's retry) and
    # processed: its rejected receipt stored, the consumed one lost
    m = world.add_outbox(OutboxState.SENT)
    world.add_ack(m, "inventory", "rejected")
    world.add_processed("inventory", m, "SUCCEEDED")

    # When the reconciler runs
    run_reconcile(world.config(engine_name, orphan_window=dt.timedelta(0)))

    # Then CONSUMED, and the receipt says consumed (what `archive --expect` waits for)
    assert world.row(m).state == OutboxState.CONSUMED
    assert world.receipts_of(m) == {"inventory": "consumed"}


def test_group_topics_limit_who_must_ack_and_unmatched_topics_alert(
        world2: World, engine_name: str) -> None:
    # Given billing consumes only PAYMENT and inventory only ORDER
    w = world2
    w.topics = {"billing": ("PAYMENT",), "inventory": ("ORDER",)}
    order = w.add_outbox(OutboxState.SENT, topic="ORDER")
    w.add_processed("inventory", order, "SUCCEEDED")
    stray = w.add_outbox(OutboxState.SENT, topic="AUDIT")

    # When the reconciler runs
    summary = run_reconcile(w.config(engine_name, orphan_window=dt.timedelta(0)))

    # Then ORDER needs only inventory's ack, and AUDIT is reported (untouched) with an alert
    assert w.row(order).state == OutboxState.CONSUMED
    assert w.receipts_of(order) == {"inventory": "consumed"}
    assert w.row(stray).state == OutboxState.SENT
    assert summary.classes[RepairClass.UNMATCHED].found == 1
    assert summary.exit_code == EXIT_ALERT


def test_max_retries_override_and_thresholds_decide_the_exit_code(
        world: World, engine_name: str) -> None:
    # Given a row with retries left by its own max_retries
    m = world.add_outbox(OutboxState.SENT, retry_count=2, max_retries=10)

    # When the reconciler runs with --max-retries 2 and a stuck threshold of 5
    from consumer_kit.reconcile import Thresholds

    summary = run_reconcile(world.config(engine_name, max_retries=2,
                                         thresholds=Thresholds(stuck=5, fail_on_failures=False)))

    # Then the override exhausts it, and with failures not alerting the run exits clean
    assert world.row(m).state == OutboxState.FAILED
    assert summary.exit_code == EXIT_OK
    crossed = run_reconcile(world.config(engine_name, thresholds=Thresholds(stuck=-1)))
    assert crossed.exit_code == EXIT_ALERT and "threshold -1" in crossed.alerts[0]


def test_a_processed_row_of_an_archived_message_is_not_an_orphan(world: World,
                                                                  engine_name: str) -> None:
    from consumer_kit.core.schema import TableNames
    from outbox_producer.ops import OutboxTables, archive

    # Given a consumed message moved to the archive, and a processed row without any outbox row
    archived = world.add_outbox(OutboxState.CONSUMED)
    world.add_processed("inventory", archived, "SUCCEEDED", age=dt.timedelta(minutes=30))
    world.add_processed("inventory", "m-true-orphan", "SUCCEEDED", age=dt.timedelta(minutes=30))
    tables = OutboxTables.from_names(TableNames(outbox=world.outbox.name,
                                                receipts=world.receipts.name))
    try:
        moved = archive(world.producer, tables, dt.timedelta(minutes=10), now=world.now)
        assert moved.moved == 1
        # When
        summary = run_reconcile(world.config(engine_name))
        # Then only the message the producer never had is an orphan
        assert summary.classes[RepairClass.ORPHAN].found == 1
        assert [s["message_id"] for s in summary.samples[RepairClass.ORPHAN]] == [
            "m-true-orphan"]
    finally:
        tables.archive.drop(world.producer, checkfirst=True)


ORPHAN_AGE = dt.timedelta(minutes=30)  # inside the default 1h orphan window before the cutoff


def test_orphan_scan_keeps_only_the_src_producer_and_the_groups_topics(
        world2: World, engine_name: str) -> None:
    # Given orphans from two producers, and billing consuming only PAYMENT
    w = world2
    w.topics = {"billing": ("PAYMENT",)}
    w.add_processed("inventory", "m-orphan-orders", age=ORPHAN_AGE, src="orders")
    w.add_processed("inventory", "m-orphan-other-src", age=ORPHAN_AGE, src="shipping")
    w.add_processed("billing", "m-orphan-payment", age=ORPHAN_AGE, topic="PAYMENT")
    w.add_processed("billing", "m-orphan-other-topic", age=ORPHAN_AGE, topic="ORDER")

    # When the reconciler scans for orphans of producer `orders`
    summary = run_reconcile(w.config(engine_name, src="orders"))

    # Then only rows from `orders` on a topic their group consumes are orphans
    found = sorted(s["message_id"] for s in summary.samples[RepairClass.ORPHAN])
    assert found == ["m-orphan-orders", "m-orphan-payment"]
    assert summary.rows_read["orphan_scan:inventory"] == 1
    assert summary.rows_read["orphan_scan:billing"] == 1

    # And without --src every producer's orphans count
    every = run_reconcile(w.config(engine_name))
    assert every.classes[RepairClass.ORPHAN].found == 3


@pytest.mark.parametrize(("threshold", "exit_code"), [(None, EXIT_OK), (0, EXIT_ALERT),
                                                      (1, EXIT_OK)])
def test_orphan_threshold_decides_the_exit_code(world: World, engine_name: str,
                                                threshold: int | None, exit_code: int) -> None:
    from consumer_kit.reconcile import Thresholds

    # Given one orphan and nothing stuck
    world.add_processed("inventory", "m-orphan", age=ORPHAN_AGE)

    # When the reconciler runs with --fail-on-orphans THRESHOLD
    summary = run_reconcile(world.config(engine_name, thresholds=Thresholds(orphans=threshold)))

    # Then only a crossed threshold alerts
    assert summary.classes[RepairClass.ORPHAN].found == 1
    assert summary.exit_code == exit_code
    if exit_code == EXIT_ALERT:
        assert summary.alerts == ["1 orphan processed rows (threshold 0)"]
    else:
        assert summary.alerts == []


@pytest.mark.parametrize(("threshold", "exit_code"), [(None, EXIT_OK), (0, EXIT_ALERT),
                                                      (1, EXIT_OK)])
def test_conflict_threshold_decides_the_exit_code(
        world: World, engine_name: str, monkeypatch: pytest.MonkeyPatch,
        threshold: int | None, exit_code: int) -> None:
    from consumer_kit.reconcile import Thresholds

    # Given an ack-lost row that another writer consumes between the read and the repair
    moved = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", moved, "SUCCEEDED")
    original = RepairApplier._apply

    def concurrent_writer_first(self: RepairApplier, key: Any, batch: Any) -> None:
        with world.producer.begin() as conn:
            conn.execute(sa.update(world.outbox).where(world.outbox.c.message_id == moved)
                         .values(state=int(OutboxState.CONSUMED),
                                 lock_version=world.outbox.c.lock_version + 1))
        original(self, key, batch)

    monkeypatch.setattr(RepairApplier, "_apply", concurrent_writer_first)

    # When the reconciler runs with --fail-on-conflicts THRESHOLD
    summary = run_reconcile(world.config(engine_name, orphan_window=dt.timedelta(0),
                                         thresholds=Thresholds(conflicts=threshold)))

    # Then the conflict alerts only when it crosses the threshold
    assert summary.conflicts == 1
    assert summary.exit_code == exit_code
    if exit_code == EXIT_ALERT:
        assert summary.alerts == ["1 repair conflicts (threshold 0)"]
    else:
        assert summary.alerts == []


@pytest.mark.parametrize(("batch_size", "statements"), [(1, 6), (2, 4), (500, 2)])
def test_repairs_split_into_batches_and_each_row_keeps_its_own_reason(
        world: World, engine_name: str, batch_size: int, statements: int) -> None:
    # Given three ack-lost rows and three rejected rows, each rejected for its own reason
    lost = [world.add_outbox(OutboxState.SENT) for _ in range(3)]
    for m in lost:
        world.add_processed("inventory", m, "SUCCEEDED")
    rejected = {world.add_outbox(OutboxState.SENT): f"error {i}" for i in range(3)}
    for m, error in rejected.items():
        world.add_processed("inventory", m, "FAILED", error=error)

    # When the reconciler repairs them BATCH_SIZE rows per statement
    summary = run_reconcile(world.config(engine_name, batch_size=batch_size,
                                         orphan_window=dt.timedelta(0)))

    # Then one statement per batch of each class, every row repaired and acked once
    assert summary.statements == statements
    assert summary.classes[RepairClass.RECEIPT_LOST].applied == 3
    assert summary.classes[RepairClass.REJECTED].applied == 3
    assert summary.conflicts == 0
    assert summary.receipts_inserted == 3
    for m in lost:
        assert world.row(m).state == OutboxState.CONSUMED
        assert world.receipts_of(m) == {"inventory": "consumed"}
    # and rows sharing a statement got their own reasons (CASE id WHEN ... THEN ...)
    for m, error in rejected.items():
        row = world.row(m)
        assert (row.state, row.fail_reason) == (OutboxState.REJECTED, f"inventory: {error}")
