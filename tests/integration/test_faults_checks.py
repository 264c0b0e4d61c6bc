"""The fault runner's checks can fail: a lost order, a doubled effect, a missing processed row
and a row never CONSUMED are each reported (SQLite stands in for the run's MariaDB)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.faults import checks, kit, world

ORDERS = 4
message_ids: dict[int, str] = {}  # order id -> outbox message id (set by the fixture)


@pytest.fixture
def engines(tmp_path: Path) -> tuple[sa.engine.Engine, sa.engine.Engine]:
    urls = {name: f"sqlite:///{tmp_path / name}.db" for name in ("orders", "inventory")}
    for url in urls.values():
        subprocess.run([*kit.CLI, "db", "init", "--url", url], check=True, capture_output=True)
    orders, inventory = sa.create_engine(urls["orders"]), sa.create_engine(urls["inventory"])
    world.orders.create(orders)
    world.effects.create(inventory)
    outbox = kit.Outbox(orders, producer=world.PRODUCER)
    ids = {}
    with orders.begin() as conn:
        for i in range(1, ORDERS + 1):
            conn.execute(world.orders.insert().values(id=i, sku="S", placed_at=0.0))
            ids[i] = outbox.publish(conn, world.TOPIC, {"order_id": i}, biz_type="order",
                                    biz_key=str(i))
        conn.execute(sa.text(f"UPDATE {kit.OUTBOX_TABLE} SET state = :s"), {"s": kit.CONSUMED})
    message_ids.update(ids)
    return orders, inventory


def apply(inventory: sa.engine.Engine, order_ids: list[int]) -> None:
    with inventory.begin() as conn:
        for i in order_ids:
            conn.execute(world.effects.insert().values(order_id=i, message_id=message_ids[i],
                                                       pid=1, at=0.0))
        for i in sorted(set(order_ids)):
            conn.execute(sa.text(
                f"INSERT INTO {kit.PROCESSED_TABLE} (consumer_group, message_id, topic, status, "
                "attempts, first_seen_at, processed_at) VALUES (:g, :m, :t, 'SUCCEEDED', 1, "
                "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"),
                {"g": world.GROUP, "m": message_ids[i], "t": world.TOPIC})


def test_the_checks_pass_when_every_order_was_applied_once(
    engines: tuple[sa.engine.Engine, sa.engine.Engine]
) -> None:
    # Given: every order applied once, every row CONSUMED
    orders, inventory = engines
    apply(inventory, [1, 2, 3, 4])

    # When
    snap = checks.snapshot(orders, inventory)

    # Then
    assert checks.problems(snap, ORDERS) == []
    assert snap.converged(ORDERS)


def test_the_checks_report_a_lost_order_a_double_effect_and_a_row_not_consumed(
    engines: tuple[sa.engine.Engine, sa.engine.Engine]
) -> None:
    # Given: order 4 never applied, order 2 applied twice, order 3's row still SENT
    orders, inventory = engines
    apply(inventory, [1, 2, 2, 3])
    with orders.begin() as conn:
        conn.execute(sa.text(f"UPDATE {kit.OUTBOX_TABLE} SET state = :s WHERE biz_key = '3'"),
                     {"s": kit.SENT})

    # When
    snap = checks.snapshot(orders, inventory)
    found = checks.problems(snap, ORDERS)
    left = checks.leftovers(orders, inventory, stormed={message_ids[3]})

    # Then
    assert (snap.lost, snap.doubled, snap.lost_sample) == (1, 1, [4])
    assert snap.doubled_sample == [{"order_id": 2, "effects": 2, "pids": "1,1"}]
    assert any(p.startswith("1 lost") for p in found)
    assert any(p.startswith("1 doubled") for p in found)
    assert any("3 processed rows" in p for p in found)
    assert any(p.startswith("1 outbox rows not CONSUMED") for p in found)
    assert left["sent_by_cause"]["receipt_lost_stormed"] == 1
    assert not snap.converged(ORDERS)


def test_a_fault_run_whose_output_reader_is_gone_writes_its_progress_to_the_run_folder(
        tmp_path: Path) -> None:
    # Given: a run whose output pipe broke (its parent killed, a `| head` done)
    from bench.faults.scenario import Config, Run
    printed: list[str] = []

    def out(line: str) -> None:
        if len(printed) == 1:
            raise BrokenPipeError(32, "Broken pipe")
        printed.append(line)

    run = Run(Config(run_dir=tmp_path), out)
    # When: it goes on reporting progress
    run.say("first")
    run.say("second")
    run.say("third")
    # Then: nothing raised (its clean-up still stops every server), the lines after the break
    # are in progress.log, and the output is not tried again
    assert printed == ["[  setup ] first"]
    assert (tmp_path / "progress.log").read_text().splitlines() == [
        "[  setup ] second", "[  setup ] third"]
