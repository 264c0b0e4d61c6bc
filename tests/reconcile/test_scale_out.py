"""Reconciling at scale on MariaDB, with both engines: the three shards of a sharded outbox in
one run (consumer groups in two other databases), and a producer read from its stopped replica
while every repair goes to the primary."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.clock import utcnow
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.schema import outbox_table, processed_table
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile import GroupSource, ReconcileConfig, RepairClass, run_reconcile
from outbox_producer import Outbox, Relay
from tests.integration.replica import ReplicaPair, replica_pair
from tests.integration.shards import Shards, shards
from tests.recording import RecordingTransport

pytestmark = pytest.mark.mariadb
ENGINES = ["sql", pytest.param("spark", marks=pytest.mark.spark)]


@pytest.fixture(name="shards")
def shards_fixture() -> Iterator[Shards]:
    yield from shards()


@pytest.fixture
def pair() -> Iterator[ReplicaPair]:
    yield from replica_pair()


def use(engine: str, request: pytest.FixtureRequest) -> None:
    """With the Spark engine, join the test run's one local Spark (tests/reconcile/conftest)."""
    if engine == "spark":
        request.getfixturevalue("spark")


@pytest.mark.parametrize("engine", ENGINES)
def test_reconcile_repairs_three_shards_in_one_run_against_groups_in_two_databases(
        shards: Shards, engine: str, request: pytest.FixtureRequest) -> None:
    use(engine, request)
    # Given four stuck messages of four kinds in each of three shards, and an orphan
    per_shard = shards.stuck_in_every_shard()
    groups = tuple(GroupSource(g, url, table=shards.names.processed)
                   for g, (url, _) in shards.groups.items())
    if engine == "spark":  # the large-window read (processed rows by time range) sees the same
        dry = run_reconcile(ReconcileConfig(
            producer_url=shards.urls[0], shards=tuple(shards.urls[1:]), engine="spark",
            outbox_table=shards.names.outbox, receipt_table=shards.names.receipts,
            groups=groups, orphan_window=dt.timedelta(0), in_list_max=0, dry_run=True))
        assert dry.details["evidence_read"] == "range"
        assert {k.value: c.found for k, c in dry.classes.items() if c.found} == {
            "receipt_lost": 3, "retry": 6, "rejected": 3}
    # When `ckit reconcile` runs over the three shards
    args = ["reconcile", "--engine", engine, "--json", "--output", "", "--quiet",
            "--outbox-table", shards.names.outbox, "--receipt-table", shards.names.receipts,
            "--orphan-window", "2h", "--no-fail-on-failures"]
    for url in shards.urls:
        args += ["--url", url]
    for group in groups:
        args += ["--group", f"{group.name}@{group.table}={group.url}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    # Then every class was found three times, once per shard, and repaired
    classes = {k: (v["found"], v["applied"]) for k, v in summary["classes"].items()}
    assert classes["receipt_lost"] == (3, 3) and classes["rejected"] == (3, 3)
    assert classes["retry"] == (6, 6) and classes["orphan"] == (1, 0)
    assert summary["conflicts"] == 0
    # and each repair landed in the shard database that holds the row
    for shard, ids in enumerate(per_shard):
        assert [shards.states(shard)[m] for m in ids] == [
            OutboxState.CONSUMED, OutboxState.PENDING, OutboxState.REJECTED,
            OutboxState.PENDING]


def states(pair: ReplicaPair, engine: sa.Engine) -> dict[str, OutboxState]:
    t = outbox_table(sa.MetaData(), pair.names.outbox)
    with engine.connect() as conn:
        return {m: OutboxState(s) for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}


@pytest.mark.parametrize("engine", ENGINES)
def test_reconcile_reads_a_stopped_replica_and_repairs_only_on_the_primary(
        pair: ReplicaPair, engine: str, request: pytest.FixtureRequest) -> None:
    use(engine, request)
    # Given four messages SENT an hour ago, the first two processed by the group (receipts lost)
    outbox = Outbox(pair.primary, producer="orders", table=pair.names.outbox)
    with pair.primary.begin() as conn:
        ids = [outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=str(k))
               for k in range(4)]
    Relay(pair.primary, RecordingTransport(), table=pair.names.outbox).run_once()
    t = outbox_table(sa.MetaData(), pair.names.outbox)
    p = processed_table(sa.MetaData(), pair.names.processed)
    old = utcnow() - dt.timedelta(hours=1)
    with pair.primary.begin() as conn:
        conn.execute(sa.update(t).values(sent_at=old)
                     .execution_options(ckit_transition="test-setup"))
        for mid in ids[:2]:
            conn.execute(sa.insert(p).values(consumer_group="inventory", message_id=mid,
                                             topic="T", status="SUCCEEDED", attempts=1,
                                             first_seen_at=old, processed_at=old))
    pair.caught_up()
    # and replication stopped, after which the primary applied the receipt of the first one
    with pair.lagging(""):
        ReceiptApplier(pair.primary, table=pair.names.outbox,
                       receipt_table_name=pair.names.receipts).apply([Receipt(ids[0], "inventory")])
        # When the reconciler reads the window from the stale replica
        summary = run_reconcile(ReconcileConfig(
            producer_url=pair.primary_url, read_urls=(pair.replica_url,), engine=engine,
            outbox_table=pair.names.outbox, receipt_table=pair.names.receipts,
            groups=(GroupSource("inventory", pair.primary_url, table=pair.names.processed),),
            orphan_window=dt.timedelta(0)))
        after = states(pair, pair.primary)
        # Then the replica's stale view of the first row was refused by the guarded repair
        lost = summary.classes[RepairClass.RECEIPT_LOST]
        assert (lost.found, lost.applied, lost.conflicts) == (2, 1, 1)
        # and the other repairs landed on the primary: the second consumed, the rest re-sent
        assert summary.classes[RepairClass.RETRY].applied == 2
        assert [after[m] for m in ids] == [OutboxState.CONSUMED, OutboxState.CONSUMED,
                                           OutboxState.PENDING, OutboxState.PENDING]
        # while the stopped replica still shows them SENT: nothing was written there
        assert set(states(pair, pair.replica).values()) == {OutboxState.SENT}
    pair.caught_up()
    assert states(pair, pair.replica) == after
