"""`ckit reconcile` refuses, before any row moves, the options its data shows wrong: a misspelt
group or another database's URL (every message would look unprocessed), a misspelt topic (its
messages would turn CONSUMED without the group), a replica lagging past --stuck-after (rows
stuck since would go unseen)."""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.schema import outbox_archive_table, processed_table
from consumer_kit.core.states import OutboxState
from tests.cli import error_line
from tests.reconcile.conftest import World

pytestmark = pytest.mark.parametrize("kind", ["sqlite"])


def run(w: World, *groups: str, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    argv = ["reconcile", "--url", w.producer_url, "--engine", "sql", "-o", "",
            "--processed-table", w.processed["inventory"].name,
            "--outbox-table", w.outbox.name, "--receipt-table", w.receipts.name,
            "--no-fail-on-failures", *extra]
    for group in groups or (f"inventory={w.group_urls['inventory']}",):
        argv += ["--group", group]
    result = CliRunner().invoke(app, argv)
    return result.exit_code, result.output


def test_a_misspelt_group_is_refused_before_any_row_moves_and_force_runs_it(
        world: World) -> None:
    # Given: messages inventory processed, their receipts lost; one at its retry limit
    ids = [world.add_outbox(OutboxState.SENT), world.add_outbox(OutboxState.SENT,
                                                                retry_count=3, max_retries=3)]
    for message_id in ids:
        world.add_processed("inventory", message_id)
    typo = f"inventroy={world.group_urls['inventory']}"
    # When: the group's name is misspelt
    code, output = run(world, typo)
    # Then: one line naming it, nothing re-sent or failed
    assert code == 2, output
    assert "--group inventroy" in error_line(output) and "misspelt" in error_line(output)
    assert [world.row(m).state for m in ids] == [int(OutboxState.SENT)] * 2
    # And with --force the operator's word is taken
    code, output = run(world, typo, extra=("--force",))
    assert code == 0, output
    assert world.row(ids[1]).state == int(OutboxState.FAILED)


def test_a_group_url_of_a_database_without_its_rows_is_refused(world: World,
                                                               tmp_path: Path) -> None:
    # Given: inventory processed the message; the URL given is the producer's own database,
    # which holds a processed table too (`ckit db init` makes one everywhere)
    message_id = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", message_id)
    table = world.processed["inventory"]
    table.metadata.create_all(world.producer, tables=[table])
    # When
    code, output = run(world, f"inventory={world.producer_url}")
    # Then
    assert code == 2, output
    assert "holds no processed row of group 'inventory'" in error_line(output)
    assert world.row(message_id).state == int(OutboxState.SENT)


def test_a_group_url_of_a_database_without_the_messages_of_its_receipts_is_refused(
        world: World) -> None:
    # Given: inventory consumed one message (its receipt came back) and another (its receipt
    # lost, so it is stuck in SENT); the producer's database holds a processed table too
    consumed = world.add_outbox(OutboxState.CONSUMED)
    world.add_processed("inventory", consumed)
    world.add_ack(consumed, "inventory")
    stuck = world.add_outbox(OutboxState.SENT, retry_count=3, max_retries=3)
    world.add_processed("inventory", stuck)
    table = world.processed["inventory"]
    table.metadata.create_all(world.producer, tables=[table])
    # When: the group's URL is the producer's database (the receipt alone used to pass it)
    code, output = run(world, f"inventory={world.producer_url}")
    # Then: one line naming the group and a message of its receipts; nothing failed
    assert code == 2, output
    line = error_line(output)
    assert "--group inventory" in line and "holds none of the 1 messages" in line, line
    assert consumed in line
    assert world.row(stuck).state == int(OutboxState.SENT)
    # And with the right URL the stuck message turns CONSUMED (its processed row found)
    code, output = run(world)
    assert code == 0, output
    assert world.row(stuck).state == int(OutboxState.CONSUMED)


def test_a_processed_table_holding_other_messages_of_the_group_is_refused(world: World) -> None:
    # Given: the group's table on the right database, and beside it another table with rows of
    # the same group name (an old copy, another environment's), none of the receipted messages
    consumed = world.add_outbox(OutboxState.CONSUMED)
    world.add_processed("inventory", consumed)
    world.add_ack(consumed, "inventory")
    stuck = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", stuck)
    other = processed_table(sa.MetaData(), "ckit_processed_copy")
    other.metadata.create_all(world.group_engines["inventory"])
    with world.group_engines["inventory"].begin() as conn:
        conn.execute(other.insert().values(
            consumer_group="inventory", message_id="m-elsewhere", topic="ORDER", src="orders",
            status="SUCCEEDED", attempts=1, first_seen_at=world.now, processed_at=world.now))
    # When: --group names that table
    code, output = run(world, f"inventory@ckit_processed_copy={world.group_urls['inventory']}")
    # Then
    assert code == 2, output
    assert "in ckit_processed_copy" in error_line(output)
    assert world.row(stuck).state == int(OutboxState.SENT)


def test_recent_receipts_whose_rows_are_gone_pass_while_nothing_is_stuck(world: World) -> None:
    # Given: a receipt whose processed row is not there, and no message stuck
    consumed = world.add_outbox(OutboxState.CONSUMED)
    world.add_ack(consumed, "inventory")
    # When / Then: nothing would be repaired wrongly: the run goes ahead
    code, output = run(world)
    assert code == 0, output


def test_a_group_that_processed_nothing_passes_while_none_of_its_messages_is_stuck(
        world: World) -> None:
    # Given: a quiet group (its rows purged), its topic's messages all consumed long ago
    world.add_outbox(OutboxState.CONSUMED)
    # When / Then: nothing to refuse: the run has nothing of its to act on
    code, output = run(world)
    assert code == 0, output


def test_a_misspelt_topic_is_refused_naming_the_topics_the_outbox_holds(world: World) -> None:
    # Given: ORDER_PAID messages only inventory processed (billing never did)
    message_id = world.add_outbox(OutboxState.SENT, topic="ORDER_PAID")
    world.add_processed("inventory", message_id, topic="ORDER_PAID")
    url = world.group_urls["inventory"]
    # When: billing's topic is misspelt, inventory consumes every topic
    code, output = run(world, f"inventory={url}", f"billing:ORDER_PAYED={url}")
    # Then: refused (the row would have turned CONSUMED without billing)
    assert code == 2, output
    line = error_line(output)
    assert "'ORDER_PAYED'" in line and "topics there: ORDER_PAID" in line
    assert world.row(message_id).state == int(OutboxState.SENT)


def test_a_quiet_topic_whose_rows_were_archived_and_a_group_whose_rows_were_purged_pass(
        world: World) -> None:
    # Given: ORDER_PAID's rows all archived; billing's processed rows purged (past the purge's
    # 7-day floor), its receipts kept; a message of billing's topic stuck now (billing's
    # consumer is down)
    paid = world.add_outbox(OutboxState.CONSUMED, topic="ORDER_PAID")
    world.add_ack(paid, "billing", age=dt.timedelta(days=8))
    archive = outbox_archive_table(sa.MetaData(), f"{world.outbox.name}_archive")
    archive.metadata.create_all(world.producer)
    with world.producer.begin() as conn:
        row = conn.execute(sa.select(world.outbox).where(
            world.outbox.c.message_id == paid)).mappings().one()
        conn.execute(sa.insert(archive).values(**row))
        conn.execute(sa.delete(world.outbox).where(world.outbox.c.message_id == paid))
    stuck = world.add_outbox(OutboxState.SENT, topic="ORDER_CREATED")
    url = world.group_urls["inventory"]
    # When
    code, output = run(world, f"billing:ORDER_PAID,ORDER_CREATED={url}")
    # Then: the run goes ahead and re-sends what billing has not processed
    assert code == 0, output
    assert world.row(stuck).state == int(OutboxState.PENDING)


def _replica_of(world: World, tmp_path: Path) -> str:
    """A copy of the producer's SQLite database as it is now (its WAL included)."""
    path = tmp_path / "replica.db"
    with contextlib.closing(sqlite3.connect(world.producer_url.removeprefix("sqlite:///"))) \
            as source, contextlib.closing(sqlite3.connect(path)) as copy:
        source.backup(copy)
    return f"sqlite:///{path}"


@pytest.mark.parametrize(("made_ago", "refused"), [(dt.timedelta(hours=2), True),
                                                   (dt.timedelta(minutes=1), False)])
def test_a_replica_lacking_a_row_made_stuck_after_ago_is_refused(
        world: World, tmp_path: Path, made_ago: dt.timedelta, refused: bool) -> None:
    # Given: a replica that stopped applying changes; the primary made a row since
    world.add_processed("inventory", world.add_outbox(OutboxState.SENT))
    replica = _replica_of(world, tmp_path)
    lost = world.add_outbox(OutboxState.SENT, age=made_ago)
    with world.producer.begin() as conn:
        conn.execute(sa.update(world.outbox).where(world.outbox.c.message_id == lost)
                     .values(gmt_create=world.now - made_ago))
    # When: reconcile reads the replica
    code, output = run(world, extra=("--read-url", replica, "--stuck-after", "1h"))
    # Then: a row made 2 h ago that it lacks stops the run; one made a minute ago does not
    if refused:
        assert code == 2, output
        assert "--read-url number 1 lags its primary" in error_line(output)
        assert world.row(lost).state == int(OutboxState.SENT)
    else:
        assert code == 0, output


def test_a_database_that_cannot_be_reached_is_refused_naming_its_option(world: World) -> None:
    # Given a stuck message, and a group URL whose server refuses connections
    stuck = world.add_outbox(OutboxState.SENT)
    # When
    code, output = run(world, "inventory=mysql+pymysql://u:S3cr3t@127.0.0.1:1/x")
    # Then one line names the option and the URL (masked), with the driver's reason
    assert code == 2, output
    line = error_line(output)
    assert line.startswith("error: --group inventory: mysql+pymysql://u:***@127.0.0.1:1/x: "
                           "cannot be used: OperationalError"), line
    assert "S3cr3t" not in output
    assert world.row(stuck).state == int(OutboxState.SENT)


def test_one_producer_database_named_twice_in_two_spellings_is_refused(world: World) -> None:
    # Given a stuck message the group processed, and the producer's URL spelt a second way
    stuck = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", stuck)
    folder, _, name = world.producer_url.rpartition("/")
    again = f"{folder}/./{name}"
    assert again != world.producer_url
    # When both are given as producer databases (shards)
    code, output = run(world, extra=("--url", again))
    # Then one line names both (the row would have been repaired, and counted, twice)
    assert code == 2, output
    line = error_line(output)
    assert "--url number 2" in line and "holds the outbox of --url number 1" in line, line
    assert "repaired, and counted, twice" in line
    assert world.row(stuck).state == int(OutboxState.SENT)


def test_a_copy_of_the_producer_database_that_lags_it_is_refused_as_another_shard(
        world: World, tmp_path: Path) -> None:
    # Given a stuck message the group processed, a copy of the producer's database (a restored
    # backup), and a newer row the copy does not hold
    stuck = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", stuck)
    copy = tmp_path / "copy.db"
    with contextlib.closing(sqlite3.connect(world.producer_url.removeprefix("sqlite:///"))) \
            as source, contextlib.closing(sqlite3.connect(copy)) as target:
        source.backup(target)
    world.add_outbox(OutboxState.SENT)
    # When the copy is given as a second producer database (a shard)
    code, output = run(world, extra=("--url", f"sqlite:///{copy}"))
    # Then one line names both before any row moves (comparing the newest rows alone let the
    # lagging copy through: each stuck row it holds would be repaired, and counted, twice)
    assert code == 2, output
    line = error_line(output)
    assert "--url number 2" in line and "holds the outbox of --url number 1" in line, line
    assert world.row(stuck).state == int(OutboxState.SENT)


def both_consume_order(w: World) -> str:
    """billing and inventory both consume ORDER: their receipts of an earlier message are
    back (its id)."""
    earlier = w.add_outbox(OutboxState.CONSUMED)
    for group in ("inventory", "billing"):
        w.add_processed(group, earlier, age=dt.timedelta(hours=2))
        w.add_ack(earlier, group, age=dt.timedelta(hours=2))
    return earlier


def test_a_group_left_out_whose_receipts_show_it_consumes_a_stuck_topic_is_refused(
        world2: World) -> None:
    # Given: billing and inventory both consume ORDER (their receipts of an earlier message are
    # back); a stuck message inventory processed and billing has not yet
    w = world2
    both_consume_order(w)
    stuck = w.add_outbox(OutboxState.SENT)
    w.add_processed("inventory", stuck)
    inventory = f"inventory={w.group_urls['inventory']}"
    # When: the operator leaves billing out
    code, output = run(w, inventory)
    # Then: one line naming billing and the topic, and the message is not made CONSUMED
    assert code == 2, output
    line = error_line(output)
    assert "billing" in line and "'ORDER'" in line and "CONSUMED without" in line, line
    assert w.row(stuck).state == int(OutboxState.SENT)
    # And with both groups it is re-sent for billing
    billing = f"billing@{w.processed['billing'].name}={w.group_urls['billing']}"
    code, output = run(w, inventory, billing)
    assert code == 0, output
    assert w.row(stuck).state == int(OutboxState.PENDING)


def test_a_group_whose_topics_leave_out_one_its_receipts_show_it_consumes_is_refused(
        world2: World) -> None:
    # Given: billing consumes ORDER too (its receipt is back); a stuck ORDER message inventory
    # processed and billing has not yet
    w = world2
    both_consume_order(w)
    w.add_outbox(OutboxState.CONSUMED, topic="PAYMENT")
    stuck = w.add_outbox(OutboxState.SENT)
    w.add_processed("inventory", stuck)
    # When: billing is given with PAYMENT only
    code, output = run(w, f"inventory={w.group_urls['inventory']}",
                       f"billing:PAYMENT@{w.processed['billing'].name}={w.group_urls['billing']}")
    # Then: one line naming billing's list and the topic; the message is not made CONSUMED
    assert code == 2, output
    line = error_line(output)
    assert "--group billing: its topics (PAYMENT) leave out 'ORDER'" in line, line
    assert w.row(stuck).state == int(OutboxState.SENT)


def test_a_host_clock_far_from_the_producer_databases_is_refused(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a message sent a minute ago, in flight (not stuck), and a host whose clock is
    # 30 minutes ahead of the producer database's (measured: SQLite has no clock of its own)
    from consumer_kit.cli import reconcile_checks
    from consumer_kit.core.db_clock import ClockOffset

    in_flight = world.add_outbox(OutboxState.SENT, age=dt.timedelta(minutes=1), retry_count=3,
                                 max_retries=3)
    world.add_processed("inventory", world.add_outbox(OutboxState.CONSUMED))
    monkeypatch.setattr(reconcile_checks, "clock_offset",
                        lambda engine: ClockOffset(seconds=-1800.0, error=0.001))
    # When
    code, output = run(world, extra=("--stuck-after", "10m"))
    # Then: one line saying how far, nothing failed
    assert code == 2, output
    line = error_line(output)
    assert "--url" in line and "1800.0 s ahead of the database's" in line, line
    assert world.row(in_flight).state == int(OutboxState.SENT)
    # And a clock within the limit passes
    monkeypatch.setattr(reconcile_checks, "clock_offset",
                        lambda engine: ClockOffset(seconds=-20.0, error=0.001))
    code, output = run(world, extra=("--stuck-after", "10m"))
    assert code == 0, output
