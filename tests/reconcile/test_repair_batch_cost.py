"""A repair batch's compare-and-set must cost what its rows cost, not the square of them.

Each row is guarded by `(id, lock_version)` and its message id. Written as one
`(id, lock_version, message_id) IN ((...), ...)` row constructor, MariaDB's range optimizer
spends time quadratic in the rows planning it (the unique `message_id` index is a candidate):
on a 250,000-row outbox a 1,000-row batch took 1.1 s to plan and 5 ms to run, and the
reconciler's writes dominated its run (38,500 repairs: 35 s of 62 s)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile.model import Decision, RepairClass, WindowRow
from consumer_kit.reconcile.repair import RepairApplier
from tests.reconcile.conftest import World, make_world

ROWS = 1000
#: CONSUMED rows between the batch's rows (ids spread as a window's are; a dense id range is
#: planned as one range)
SPREAD = 50


@pytest.fixture
def maria_world(tmp_path: Path) -> Iterator[World]:
    yield from make_world("mariadb", tmp_path)


@pytest.mark.mariadb
def test_a_repair_batch_of_a_thousand_rows_is_planned_in_linear_time(maria_world: World) -> None:
    world = maria_world
    ts = world.now.replace(microsecond=0)
    rows = [dict(message_id=f"m{i:06d}", biz_type="T", biz_key=str(i), topic="ORDER",
                 body=b"{}", state=int(OutboxState.SENT), retry_count=0, max_retries=3,
                 next_retry_at=ts, sent_at=ts, lock_version=2, created_by="t", updated_by="t",
                 gmt_create=ts, gmt_modified=ts) for i in range(ROWS * SPREAD)]
    for i, row in enumerate(rows):
        if i % SPREAD:
            row["state"] = int(OutboxState.CONSUMED)
    with world.producer.begin() as conn:
        for start in range(0, len(rows), 5000):
            conn.execute(world.outbox.insert(), rows[start:start + 5000])
        read = conn.execute(world.outbox.select().where(
            world.outbox.c.state == int(OutboxState.SENT))).all()
    applier = RepairApplier(world.producer, outbox=world.outbox.name,
                            receipts=world.receipts.name, now=world.now, dry_run=False,
                            batch_size=ROWS)
    started = time.monotonic()
    for r in read:
        applier.add(Decision(row=WindowRow(id=r.id, message_id=r.message_id, topic="ORDER",
                                           state=r.state, retry_count=0, max_retries=3,
                                           lock_version=r.lock_version),
                             klass=RepairClass.RETRY, reason=f"not consumed {r.id}"))
    result = applier.finish()
    elapsed = time.monotonic() - started
    assert result.counts[RepairClass.RETRY].applied == ROWS
    assert elapsed < 0.4, f"one {ROWS}-row repair statement took {elapsed:.2f}s"
