"""Operator actions on the outbox (`outbox_producer.ops`) on SQLite and real MariaDB.

Rows are inserted directly with SQLAlchemy Core so each test states exactly what it starts from.
The `db` fixture (tests/conftest.py) gives every test its own table names and drops them after.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import AmbiguousTarget, ArchiveBusy, ConfigError
from consumer_kit.core.schema import TableNames
from consumer_kit.core.states import OutboxState
from outbox_producer import ops
from outbox_producer.ops import archiving as archive
from outbox_producer.ops import commands
from tests.conftest import Db

NOW = dt.datetime(2026, 1, 15, 12, 0, 0)
_seq = itertools.count()


def tables(db: Db) -> ops.OutboxTables:
    return ops.OutboxTables.from_names(db.names)


def insert(db: Db, state: OutboxState = OutboxState.PENDING, **fields: Any) -> dict[str, Any]:
    """Insert one outbox row (defaults filled in) and return it as stored."""
    n = next(_seq)
    created = fields.pop("gmt_create", NOW - dt.timedelta(minutes=5))
    row: dict[str, Any] = {
        "message_id": f"m-{uuid.uuid4().hex}",
        "biz_type": "ORDER_CREATED",
        "biz_key": f"k{n}",
        "topic": "ORDERS",
        "body": b'{"n": 1}',
        "state": int(state),
        "next_retry_at": created,
        "gmt_create": created,
        "gmt_modified": fields.pop("gmt_modified", created),
        **fields,
    }
    outbox = tables(db).outbox
    with db.engine.begin() as conn:
        row["id"] = conn.execute(sa.insert(outbox).values(**row)).inserted_primary_key[0]  # type: ignore[index]
    return get(db, row["id"])


def get(db: Db, row_id: int) -> dict[str, Any]:
    outbox = tables(db).outbox
    with db.engine.connect() as conn:
        return dict(conn.execute(sa.select(outbox).where(outbox.c.id == row_id)).mappings().one())


def ack(db: Db, message_id: str, group: str, outcome: str = "consumed") -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.insert(tables(db).receipts).values(
            message_id=message_id, consumer_group=group, outcome=outcome, received_at=NOW))


# ----------------------------------------------------------------------------------------- stats


def test_stats_counts_every_state_and_reports_zero_for_absent_ones(db: Db) -> None:
    # Given two PENDING rows, one FAILED row and nothing else
    insert(db)
    insert(db)
    insert(db, OutboxState.FAILED)
    # When
    result = ops.stats(db.engine, tables(db).outbox, now=NOW)
    # Then every state is listed, in code order
    assert list(result.counts) == [s.name for s in OutboxState]
    assert result.counts["PENDING"] == 2 and result.counts["FAILED"] == 1
    assert result.counts["CONSUMED"] == 0 and result.total == 3


def test_stats_reports_oldest_pending_and_sent_ages_and_the_lag_percentiles(db: Db) -> None:
    # Given a PENDING row created 10 min ago, a SENT row sent 3 min ago and 20 rows consumed
    # 1..20 s after being sent within the last hour (plus one sent 2 h ago: outside the window)
    insert(db, gmt_create=NOW - dt.timedelta(minutes=10))
    insert(db, gmt_create=NOW - dt.timedelta(minutes=2))
    insert(db, OutboxState.SENT, sent_at=NOW - dt.timedelta(minutes=3))
    for lag in range(1, 21):
        sent = NOW - dt.timedelta(minutes=30)
        insert(db, OutboxState.CONSUMED, sent_at=sent, consumed_at=sent + dt.timedelta(seconds=lag))
    old = NOW - dt.timedelta(hours=2)
    insert(db, OutboxState.CONSUMED, sent_at=old, consumed_at=old + dt.timedelta(seconds=999))
    # When
    result = ops.stats(db.engine, tables(db).outbox, now=NOW)
    # Then
    assert result.oldest_pending_age_s == pytest.approx(600)
    assert result.oldest_sent_age_s == pytest.approx(180)
    assert result.lag is not None
    assert (result.lag.samples, result.lag.p50, result.lag.p95, result.lag.max) == (20, 10, 19, 20)


def test_stats_of_an_empty_outbox_has_no_ages_and_no_lag(db: Db) -> None:
    result = ops.stats(db.engine, tables(db).outbox, now=NOW)
    assert result.total == 0 and result.lag is None and result.oldest_pending_age_s is None


# ------------------------------------------------------------------------------------------ show


def test_show_finds_a_message_by_message_id_with_its_ack_rows(db: Db) -> None:
    # Given a SENT row acked by two groups
    row = insert(db, OutboxState.SENT)
    ack(db, row["message_id"], "stock")
    ack(db, row["message_id"], "billing", "rejected")
    # When
    [view] = ops.show(db.engine, tables(db), row["message_id"])
    # Then
    assert view.row["id"] == row["id"] and view.state is OutboxState.SENT
    assert [a["consumer_group"] for a in view.receipts] == ["billing", "stock"]
    assert view.to_dict()["message"]["body"] == '{"n": 1}'


def test_show_falls_back_to_the_biz_key_across_every_biz_type(db: Db) -> None:
    # Given one biz key used by two biz types
    insert(db, biz_type="ORDER_CREATED", biz_key="order-42")
    insert(db, biz_type="ORDER_PAID", biz_key="order-42")
    # When
    views = ops.show(db.engine, tables(db), "order-42")
    # Then
    assert [v.row["biz_type"] for v in views] == ["ORDER_CREATED", "ORDER_PAID"]
    assert ops.show(db.engine, tables(db), "no-such-thing") == []


def test_a_biz_key_holding_a_colon_is_read_both_ways_and_never_picks_another_row(
        db: Db) -> None:
    # Given a row whose biz key holds a colon, and a row whose type and key read the same
    tenant = insert(db, OutboxState.FAILED, biz_type="order", biz_key="tenant7:42")
    typed = insert(db, OutboxState.FAILED, biz_type="tenant7", biz_key="42")
    lone = insert(db, OutboxState.FAILED, biz_type="order", biz_key="id:2")
    # When an operator names biz:tenant7:42, Then it is refused, naming both rows
    with pytest.raises(AmbiguousTarget, match=f"ids {typed['id']}.*ids {tenant['id']}"):
        ops.retry(db.engine, tables(db), ["biz:tenant7:42"])
    assert {get(db, r["id"])["state"] for r in (tenant, typed)} == {int(OutboxState.FAILED)}
    # and a key holding a colon that only one row has is found by it
    [view] = ops.show(db.engine, tables(db), "biz:id:2")
    assert view.row["id"] == lone["id"]
    # and one that no row has, none
    assert ops.show(db.engine, tables(db), "biz:tenant7:43") == []


def test_a_row_named_twice_in_one_command_is_moved_once_and_not_reported_as_a_conflict(
        db: Db) -> None:
    row = insert(db, OutboxState.FAILED)
    result = ops.retry(db.engine, tables(db), [row["id"], f"id:{row['id']}"])
    assert result.changed == [row["id"]] and result.refused == []


def test_only_ascii_digits_name_a_row_id(db: Db) -> None:
    insert(db, OutboxState.FAILED)
    with pytest.raises(AmbiguousTarget, match="digits 0-9"):
        ops.show(db.engine, tables(db), "id:\u0664")
    with pytest.raises(AmbiguousTarget, match="digits 0-9"):
        ops.show(db.engine, tables(db), "id:" + "9" * 30)


def test_an_sqlite_outbox_never_hands_an_archived_rows_id_out_again(tmp_path: Any) -> None:
    # Given a SQLite outbox whose newest rows were archived
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.ddl import init_db

    engine = make_engine(f"sqlite:///{tmp_path / 'o.db'}")
    init_db(engine)
    names = TableNames()
    db = Db(engine, names, "sqlite", str(engine.url))
    old = NOW - dt.timedelta(days=40)
    first = [insert(db, OutboxState.CONSUMED, gmt_create=old)["id"] for _ in range(2)]
    assert archive.archive(engine, tables(db), dt.timedelta(days=30), now=NOW).moved == 2
    # When new rows are written and archived in their turn
    later = [insert(db, OutboxState.CONSUMED, gmt_create=old)["id"] for _ in range(2)]
    # Then their ids are new ones, and archiving them again works
    assert min(later) > max(first)
    assert archive.archive(engine, tables(db), dt.timedelta(days=30), now=NOW).moved == 2
    engine.dispose()


# ----------------------------------------------------------------------------------- transitions


def test_retry_puts_a_failed_row_back_to_pending_due_now_with_the_count_reset(db: Db) -> None:
    # Given a FAILED row after 10 attempts
    row = insert(db, OutboxState.FAILED, retry_count=10, fail_reason="broker down", lock_version=7)
    # When
    result = ops.retry(db.engine, tables(db), [row["message_id"]], now=NOW)
    # Then the compare-and-set moved it and bumped the version
    assert result.changed == [row["id"]] and result.refused == []
    after = get(db, row["id"])
    assert after["state"] == OutboxState.PENDING and after["retry_count"] == 0
    assert after["next_retry_at"] == NOW and after["gmt_modified"] == NOW
    assert after["lock_version"] == 8 and after["updated_by"] == "operator"
    assert after["fail_reason"] == "operator retry (was FAILED): broker down"


def test_retry_twice_does_not_stack_the_reason_prefix(db: Db) -> None:
    row = insert(db, OutboxState.REJECTED, fail_reason="bad sku")
    ops.retry(db.engine, tables(db), [row["id"]])
    ops.suspend(db.engine, tables(db).outbox, [row["id"]])
    ops.retry(db.engine, tables(db), [row["id"]])
    assert get(db, row["id"])["fail_reason"] == "operator retry (was SUSPENDED): bad sku"


def test_retry_refuses_rows_in_a_state_it_does_not_handle(db: Db) -> None:
    # Given a PENDING row and an id that does not exist
    row = insert(db)
    # When
    result = ops.retry(db.engine, tables(db), [row["id"], 999_999])
    # Then nothing changed and each refusal says why
    assert result.changed == []
    assert [(r.target, r.state) for r in result.refused] == [(row["id"], "PENDING"),
                                                             (999_999, None)]
    assert "not found" in result.refused[1].reason
    assert get(db, row["id"])["lock_version"] == 0


def test_retry_leaves_a_consumed_row_alone_unless_forced(db: Db) -> None:
    # Given a CONSUMED row
    row = insert(db, OutboxState.CONSUMED, consumed_at=NOW)
    # When retried without force, then with force
    refused = ops.retry(db.engine, tables(db), [row["id"]])
    forced = ops.retry(db.engine, tables(db), [row["id"]], force=True)
    # Then only the forced retry moved it
    assert refused.changed == [] and "--force" in refused.refused[0].reason
    assert forced.changed == [row["id"]]
    assert get(db, row["id"])["state"] == OutboxState.PENDING


def test_retry_of_sent_rows_needs_force_even_when_asked_for_by_state(db: Db) -> None:
    # Given a SENT row
    row = insert(db, OutboxState.SENT)
    # When retried by state without force, by id without force, then by state with force
    with pytest.raises(ValueError, match="SENT, CONSUMED with --force"):
        ops.retry(db.engine, tables(db), [row["id"]], states=[OutboxState.SENT])
    by_id = ops.retry(db.engine, tables(db), [row["id"]])
    assert get(db, row["id"])["state"] == OutboxState.SENT
    forced = ops.retry(db.engine, tables(db), [row["id"]], states=[OutboxState.SENT], force=True)
    # Then only the forced retry moved it
    assert by_id.changed == [] and "--force" in by_id.refused[0].reason
    assert forced.changed == [row["id"]]
    assert get(db, row["id"])["state"] == OutboxState.PENDING


def test_a_retried_rejected_row_becomes_consumed_on_the_new_ack(db: Db) -> None:
    # Given a row that the inventory group rejected (its ack row stored)
    from consumer_kit.core.receipt import ReceiptOutcome
    from outbox_producer import Receipt, ReceiptApplier

    row = insert(db, OutboxState.SENT)
    acks = ReceiptApplier(db.engine, table=db.names.outbox, receipt_table_name=db.names.receipts)
    acks.apply([Receipt(row["message_id"], "inventory", ReceiptOutcome.REJECTED, "sku unknown")])
    assert get(db, row["id"])["state"] == OutboxState.REJECTED
    # When an operator re-queues it, and the re-send is consumed by the same group
    result = ops.retry(db.engine, tables(db), [row["id"]])
    with db.engine.connect() as conn:
        left = conn.scalar(sa.select(sa.func.count()).select_from(tables(db).receipts))
    applied = acks.apply([Receipt(row["message_id"], "inventory")])
    # Then the old reject no longer decides: the row is CONSUMED
    assert result.changed == [row["id"]] and left == 0
    assert (applied.recorded, applied.consumed) == (1, 1)
    assert get(db, row["id"])["state"] == OutboxState.CONSUMED


def test_a_refused_retry_keeps_the_ack_rows(db: Db) -> None:
    # Given a CONSUMED row with its ack
    row = insert(db, OutboxState.CONSUMED, consumed_at=NOW)
    ack(db, row["message_id"], "stock")
    # When a retry without force is refused
    refused = ops.retry(db.engine, tables(db), [row["id"]])
    # Then its ack row is still there
    [view] = ops.show(db.engine, tables(db), row["message_id"])
    assert refused.changed == [] and [a["consumer_group"] for a in view.receipts] == ["stock"]


def test_retry_counts_a_conflict_when_the_row_moved_after_it_was_read(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a FAILED row that a relay bumps right after the operator command read it
    row = insert(db, OutboxState.FAILED)
    outbox = tables(db).outbox
    real_one = commands.one

    def read_then_concurrent_write(conn: Any, table: sa.Table, ident: str, cols: Any) -> Any:
        loaded = real_one(conn, table, ident, cols)
        with db.engine.begin() as other:
            other.execute(sa.update(outbox).where(outbox.c.id == row["id"])
                          .values(lock_version=outbox.c.lock_version + 1))
        return loaded

    monkeypatch.setattr(commands, "one", read_then_concurrent_write)
    # When
    result = ops.retry(db.engine, tables(db), [row["id"]])
    # Then the compare-and-set did not overwrite it
    assert result.changed == [] and result.conflicts == 1
    assert get(db, row["id"])["state"] == OutboxState.FAILED


def test_suspend_holds_pending_failed_and_expired_sending_rows_but_not_a_live_lease(
    db: Db,
) -> None:
    # Given
    pending = insert(db)
    failed = insert(db, OutboxState.FAILED)
    expired = insert(db, OutboxState.SENDING, lease_owner="r1",
                     lease_until=NOW - dt.timedelta(seconds=1))
    live = insert(db, OutboxState.SENDING, lease_owner="r2",
                  lease_until=NOW + dt.timedelta(minutes=1))
    sent = insert(db, OutboxState.SENT)
    # When
    result = ops.suspend(db.engine, tables(db).outbox,
                         [r["id"] for r in (pending, failed, expired, live, sent)], now=NOW)
    # Then
    assert sorted(result.changed) == sorted([pending["id"], failed["id"], expired["id"]])
    assert {r.target: r.state for r in result.refused} == {live["id"]: "SENDING",
                                                           sent["id"]: "SENT"}
    assert "live lease" in next(r.reason for r in result.refused if r.target == live["id"])
    assert get(db, expired["id"])["state"] == OutboxState.SUSPENDED
    assert get(db, expired["id"])["lease_owner"] is None


def test_resume_puts_a_suspended_row_back_to_pending_and_refuses_others(db: Db) -> None:
    # Given a SUSPENDED row with 3 attempts and a FAILED row
    held = insert(db, OutboxState.SUSPENDED, retry_count=3)
    failed = insert(db, OutboxState.FAILED)
    # When
    result = ops.resume(db.engine, tables(db).outbox, [held["id"], failed["id"]], now=NOW)
    # Then
    assert result.changed == [held["id"]] and result.refused[0].state == "FAILED"
    after = get(db, held["id"])
    assert (after["state"], after["retry_count"], after["next_retry_at"]) == (0, 3, NOW)


def test_bulk_selection_picks_rows_by_state_and_topic_up_to_the_limit(db: Db) -> None:
    # Given 3 FAILED rows on topic A, one FAILED on B and one PENDING on A
    a_rows = [insert(db, OutboxState.FAILED, topic="A")["id"] for _ in range(3)]
    insert(db, OutboxState.FAILED, topic="B")
    insert(db, topic="A")
    # When
    ids = ops.select_ids(db.engine, tables(db).outbox, states=[OutboxState.FAILED], topic="A",
                         limit=2)
    result = ops.retry(db.engine, tables(db), ids, states=[OutboxState.FAILED])
    # Then the two oldest FAILED rows of topic A were re-queued
    assert ids == a_rows[:2] and result.changed == a_rows[:2]


def test_an_unknown_state_or_a_state_retry_cannot_handle_is_a_value_error(db: Db) -> None:
    with pytest.raises(ValueError, match="valid: 0=PENDING"):
        OutboxState.parse("LOST")
    with pytest.raises(ValueError, match="cannot retry PENDING"):
        ops.retry(db.engine, tables(db), [1], states=[OutboxState.PENDING])


def test_a_bad_table_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid"):
        ops.OutboxTables.from_names(TableNames(outbox="x; drop table"))


# --------------------------------------------------------------------------------------- archive


def archived_ids(db: Db) -> list[int]:
    archive = tables(db).archive
    with db.engine.connect() as conn:
        return sorted(conn.scalars(sa.select(archive.c.id)))


def test_archive_moves_only_old_terminal_rows_in_bounded_batches(db: Db) -> None:
    # Given 5 old CONSUMED rows, an old REJECTED row, and rows that must stay: an old FAILED row,
    # a recent CONSUMED row and an old row that was re-touched recently
    old = NOW - dt.timedelta(days=40)
    moved = [insert(db, OutboxState.CONSUMED, gmt_create=old)["id"] for _ in range(5)]
    moved.append(insert(db, OutboxState.REJECTED, gmt_create=old)["id"])
    stay = [
        insert(db, OutboxState.FAILED, gmt_create=old)["id"],
        insert(db, OutboxState.CONSUMED, gmt_create=NOW - dt.timedelta(days=1))["id"],
        insert(db, OutboxState.CONSUMED, gmt_create=old, gmt_modified=NOW)["id"],
    ]
    # When archiving rows older than 30 days, 4 rows per batch
    result = archive.archive(db.engine, tables(db), dt.timedelta(days=30), batch=4, now=NOW)
    # Then the six moved in two batches, and the others stayed
    assert (result.moved, result.batches, result.more) == (6, 2, False)
    assert archived_ids(db) == sorted(moved)
    with db.engine.connect() as conn:
        left = sorted(conn.scalars(sa.select(tables(db).outbox.c.id)))
    assert left == sorted(stay)


def test_archive_stops_after_max_batches_and_says_there_is_more(db: Db) -> None:
    old = NOW - dt.timedelta(days=40)
    for _ in range(5):
        insert(db, OutboxState.CONSUMED, gmt_create=old)
    first = archive.archive(db.engine, tables(db), dt.timedelta(days=30), batch=2, max_batches=1,
                        now=NOW)
    rest = archive.archive(db.engine, tables(db), dt.timedelta(days=30), batch=2, now=NOW)
    assert (first.moved, first.more) == (2, True)
    assert (rest.moved, rest.more) == (3, False)


def test_archive_dry_run_counts_without_moving_anything(db: Db) -> None:
    insert(db, OutboxState.CONSUMED, gmt_create=NOW - dt.timedelta(days=40))
    result = archive.archive(db.engine, tables(db), dt.timedelta(days=30), dry_run=True, now=NOW)
    assert (result.moved, result.dry_run) == (1, True)
    assert archived_ids(db) == []


def test_archive_creates_the_archive_table_when_it_is_missing(db: Db) -> None:
    # Given no archive table
    tables(db).archive.drop(db.engine)
    row = insert(db, OutboxState.CONSUMED, gmt_create=NOW - dt.timedelta(days=40))
    # When
    archive.archive(db.engine, tables(db), dt.timedelta(days=30), now=NOW)
    # Then
    assert archived_ids(db) == [row["id"]]


def test_archive_rejects_a_non_positive_horizon_and_non_terminal_states(db: Db) -> None:
    with pytest.raises(ValueError, match="positive"):
        archive.archive(db.engine, tables(db), dt.timedelta(0))
    with pytest.raises(ValueError, match="terminal"):
        archive.archive(db.engine, tables(db), dt.timedelta(days=1), states=[OutboxState.SENT])


def test_a_second_archive_run_on_the_same_table_is_refused_while_one_runs(db: Db) -> None:
    if db.kind == "sqlite":
        pytest.skip("SQLite serialises archive batches through its write lock instead")
    insert(db, OutboxState.CONSUMED, gmt_create=NOW - dt.timedelta(days=40))
    # Given a run holding the lock (from another connection)
    with archive.single_instance(db.engine, tables(db).outbox.name), \
            pytest.raises(ArchiveBusy, match="another"):
        # When a second run starts, then it is refused
        archive.archive(db.engine, tables(db), dt.timedelta(days=30), now=NOW)
    # And once the first is done, a run goes through
    assert archive.archive(db.engine, tables(db), dt.timedelta(days=30), now=NOW).moved == 1


@pytest.mark.parametrize("state", [OutboxState.CONSUMED, OutboxState.REJECTED, OutboxState.SENT])
def test_a_forced_retry_of_a_row_that_went_out_marks_the_re_send_as_a_resend(
        db: Db, state: OutboxState) -> None:
    # Given: a row that went out, but whose sent_at is empty (its receipt beat the sender's
    # mark under an older version) - and a FAILED row that may never have gone out
    went_out = insert(db, state, sent_at=None)
    failed = insert(db, OutboxState.FAILED, sent_at=None)
    # When: both are retried
    ops.retry(db.engine, tables(db), [went_out["id"], failed["id"]], force=True, now=NOW)
    # Then: only the one that went out is re-sent as a re-send (`ckit_resend`)
    assert get(db, went_out["id"])["sent_at"] == NOW
    assert get(db, failed["id"])["sent_at"] is None


def test_one_target_given_as_a_string_names_one_row_not_one_per_character(db: Db) -> None:
    # Given FAILED rows 1 and 2, and a third whose message id holds their digits
    first, second = insert(db, OutboxState.FAILED), insert(db, OutboxState.FAILED)
    meant = insert(db, OutboxState.FAILED, message_id=f"m-{first['id']}{second['id']}")
    # When one message id is given as it is (`show` takes one), not in a list
    result = ops.retry(db.engine, tables(db), meant["message_id"], now=NOW)
    # Then that row alone is re-sent (each character was a target: "1" and "2" re-sent rows
    # 1 and 2, and with force, SENT and CONSUMED rows a second time)
    assert result.changed == [meant["id"]] and result.refused == []
    assert get(db, first["id"])["state"] == get(db, second["id"])["state"] == OutboxState.FAILED
    held = ops.suspend(db.engine, tables(db).outbox, str(first["id"]), now=NOW)
    assert held.changed == [first["id"]]
    assert ops.resume(db.engine, tables(db).outbox, first["id"], now=NOW).changed == [first["id"]]
