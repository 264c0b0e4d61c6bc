"""`ckit reconcile` stopped by a database error after some repairs committed says how many and
exits 1: its exit 2 says nothing was done."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.cli.runtime import EXIT_FAILURE
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile.sql_source import SqlSource
from tests.cli import error_line
from tests.poison import POISON, refused
from tests.reconcile.conftest import World


@pytest.mark.parametrize("closing", ["closes", "fails to close"])
def test_a_reconcile_failing_after_a_repair_says_it_was_applied_and_exits_1(
        world: World, closing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given three rows whose receipt was lost, repaired one per batch, and the database
    # refusing to update the second
    lost = [world.add_outbox(OutboxState.SENT) for _ in range(3)]
    for message_id in lost:
        world.add_processed("inventory", message_id)
    if closing == "fails to close":  # (Spark's stop failing, say): the run's error is kept
        def close(self: SqlSource) -> None:
            raise RuntimeError("close failed")
        monkeypatch.setattr(SqlSource, "close", close)
    with refused(world.producer, world.outbox.name, "UPDATE", "message_id", lost[1]):
        # When the reconciler runs
        result = CliRunner().invoke(app, [
            "reconcile", "--url", world.producer_url,
            "--group", f"inventory={world.group_urls['inventory']}",
            "--processed-table", world.processed["inventory"].name,
            "--outbox-table", world.outbox.name, "--receipt-table", world.receipts.name,
            "--engine", "sql", "--output", "", "--quiet", "--batch-size", "1"])
    # Then the first repair stays, the line says so, and the exit is 1
    assert result.exit_code == EXIT_FAILURE, result.output
    warned = "closing after the error failed too: close failed"
    assert (warned in result.output) is (closing == "fails to close")
    line = error_line("\n".join(x for x in result.output.splitlines() if warned not in x))
    assert POISON in line and "after 1 repair applied: that stays committed" in line
    assert [world.row(m).state for m in lost] == [
        OutboxState.CONSUMED, OutboxState.SENT, OutboxState.SENT]
