"""The reconciler never re-sends a message made before the consumers' dedupe horizon.

A consumer dedupes a delivery by its processed row (and its Redis done marker), which `ckit
processed purge` may delete once it is 7 days old (`PURGE_FLOOR`). A message stuck in SENT that
was made longer ago than that (a reconciler that did not run for a week, a first run on an old
outbox, receipts that were never sent) and of which a group has no processed row may have been
processed by that group and purged since: a re-send would apply it twice. Such rows are
reported (and alert), never re-sent.
"""

from __future__ import annotations

import datetime as dt

import pytest

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.states import OutboxState
from consumer_kit.processed import PURGE_FLOOR
from consumer_kit.reconcile import EXIT_ALERT, RepairClass, run_reconcile
from consumer_kit.reconcile.model import DEDUPE_HORIZON
from tests.reconcile.conftest import World

WEEK_AGO = dt.timedelta(days=8)
DAYS_AGO = dt.timedelta(days=5)


def test_the_horizon_is_inside_processed_purges_floor() -> None:
    # a day's margin for the clocks of the producer, the consumers and the reconciler
    margin = PURGE_FLOOR - DEDUPE_HORIZON
    assert margin >= dt.timedelta(days=1)


def test_a_message_older_than_the_purge_floor_is_reported_never_re_sent(
        world2: World, engine_name: str) -> None:
    # Given a message made 8 days ago that billing processed and inventory has no row of (its
    # row may have been purged: ckit processed purge keeps 7 days)
    w = world2
    old = w.add_outbox(OutboxState.SENT, age=WEEK_AGO, retry_count=0, max_retries=3)
    w.add_processed("billing", old, "SUCCEEDED", age=WEEK_AGO)
    # one made 8 days ago that every group processed, one made 5 days ago that inventory
    # lacks (its row cannot have been purged under the floor), and one 8 days old out of retries
    consumed = w.add_outbox(OutboxState.SENT, age=WEEK_AGO)
    w.add_processed("inventory", consumed, "SUCCEEDED", age=WEEK_AGO)
    w.add_processed("billing", consumed, "SUCCEEDED", age=WEEK_AGO)
    recent = w.add_outbox(OutboxState.SENT, age=DAYS_AGO, retry_count=0, max_retries=3)
    w.add_processed("billing", recent, "SUCCEEDED", age=DAYS_AGO)
    spent = w.add_outbox(OutboxState.SENT, age=WEEK_AGO, retry_count=3, max_retries=3)
    before = w.row(old)

    # When the reconciler runs
    summary = run_reconcile(w.config(engine_name, orphan_window=dt.timedelta(0)))

    # Then the old message is left SENT, untouched, reported and alerted on
    after = w.row(old)
    assert (after.state, after.lock_version, after.retry_count) == (
        OutboxState.SENT, before.lock_version, 0)
    beyond = summary.classes[RepairClass.BEYOND_DEDUPE]
    assert (beyond.found, beyond.intended, beyond.applied) == (1, 0, 0)
    sample = summary.samples[RepairClass.BEYOND_DEDUPE][0]
    assert sample["message_id"] == old
    assert sample["groups_missing"] == ["inventory"]
    assert "inventory" in sample["reason"] and "twice" in sample["reason"]
    assert summary.exit_code == EXIT_ALERT
    assert any("beyond_dedupe" in a for a in summary.alerts)
    # and the others are repaired as before
    assert w.row(consumed).state == OutboxState.CONSUMED
    assert (w.row(recent).state, w.row(recent).retry_count) == (OutboxState.PENDING, 1)
    assert w.row(spent).state == OutboxState.FAILED
    assert summary.classes[RepairClass.RETRY].found == 1


def test_a_longer_dedupe_horizon_re_sends_what_the_consumers_still_dedupe(
        world2: World, engine_name: str) -> None:
    # Given consumers that keep processed rows 30 days, and a message made 8 days ago that
    # inventory has no row of
    w = world2
    old = w.add_outbox(OutboxState.SENT, age=WEEK_AGO, retry_count=0, max_retries=3)
    w.add_processed("billing", old, "SUCCEEDED", age=WEEK_AGO)
    # When the reconciler runs with --dedupe-horizon 29d
    summary = run_reconcile(w.config(engine_name, orphan_window=dt.timedelta(0),
                                     dedupe_horizon=dt.timedelta(days=29)))
    # Then it is re-sent, as a message inside the horizon is
    assert (w.row(old).state, w.row(old).retry_count) == (OutboxState.PENDING, 1)
    assert summary.classes[RepairClass.RETRY].found == 1
    assert summary.classes[RepairClass.BEYOND_DEDUPE].found == 0


def test_a_dedupe_horizon_not_past_stuck_after_is_refused(world2: World) -> None:
    # a horizon inside the stuck window would leave every stuck message unsent
    with pytest.raises(ConfigError, match="--dedupe-horizon 10m must be longer than "
                                          "--stuck-after"):
        world2.config("sql", dedupe_horizon=dt.timedelta(minutes=10))
