"""`--read-url` pairs with `--url` by position: two swapped ones (each a replica of the other
shard) must not let a repair land on another message that has the same id and version."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.ddl import init_db
from consumer_kit.core.schema import outbox_table, processed_table
from consumer_kit.reconcile import GroupSource, ReconcileConfig, run_reconcile
from outbox_producer import Outbox, Relay
from tests.recording import RecordingTransport


@dataclass
class TwoShards:
    a: str
    b: str
    inventory: str
    lost_in_a: str  # never processed: must be re-sent
    processed_from_b: str  # processed, receipt lost


def stuck_row(url: str, key: str) -> str:
    """One SENT row, sent two hours ago, in a fresh database (row id 1, version 2)."""
    engine = make_engine(url)
    init_db(engine)
    outbox = Outbox(engine, producer="orders")
    with engine.begin() as conn:
        message_id = outbox.publish(conn, "T", {"k": key}, biz_type="t", biz_key=key)
    Relay(engine, RecordingTransport()).run_once()
    t = outbox_table(sa.MetaData(), "ckit_outbox")
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(sent_at=utcnow() - dt.timedelta(hours=2)))
    engine.dispose()
    return message_id


@pytest.fixture
def shards(tmp_path: Path) -> TwoShards:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    lost, processed = stuck_row(a, "a"), stuck_row(b, "b")
    inventory = f"sqlite:///{tmp_path / 'inventory.db'}"
    engine = make_engine(inventory)
    init_db(engine)
    hour_ago = utcnow() - dt.timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(sa.insert(processed_table(sa.MetaData(), "ckit_processed")).values(
            consumer_group="inventory", message_id=processed, topic="T", status="SUCCEEDED",
            attempts=1, first_seen_at=hour_ago, processed_at=hour_ago))
    engine.dispose()
    return TwoShards(a, b, inventory, lost, processed)


def states(url: str) -> dict[str, int]:
    engine = make_engine(url)
    t = outbox_table(sa.MetaData(), "ckit_outbox")
    with engine.connect() as conn:
        found = {m: int(s) for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}
    engine.dispose()
    return found


def test_a_repair_read_from_another_databases_replica_is_a_conflict_not_a_wrong_move(
        shards: TwoShards) -> None:
    # Given the read URLs swapped: each shard is read from the other's copy
    before = (states(shards.a), states(shards.b))
    summary = run_reconcile(ReconcileConfig(
        producer_url=shards.a, shards=(shards.b,), read_urls=(shards.b, shards.a),
        engine="sql", groups=(GroupSource("inventory", shards.inventory),),
        orphan_window=dt.timedelta(0)))
    # Then each repair meets a row of the same id and version holding another message, and
    # leaves it: the never-processed message is not marked CONSUMED, the other not re-sent
    assert summary.conflicts == 2
    assert (states(shards.a), states(shards.b)) == before


def test_swapped_read_urls_are_refused_with_one_line_before_anything_is_read(
        shards: TwoShards) -> None:
    before = (states(shards.a), states(shards.b))
    result = CliRunner().invoke(app, [
        "reconcile", "--engine", "sql", "--output", "", "--url", shards.a, "--url", shards.b,
        "--read-url", shards.b, "--read-url", shards.a,
        "--group", f"inventory={shards.inventory}"])
    assert result.exit_code == 2, result.output
    assert "--read-url number 1 is not a replica of --url number 1" in result.output
    assert (states(shards.a), states(shards.b)) == before
