"""`ckit acks`, 0.1.0's command, still runs as `ckit receipts`: it says so, since it no longer
reads 0.1.0's ckit-ack-<producer> topic (acks left there are never applied)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from consumer_kit.cli.main import app
from tests.conftest import Db


def test_the_old_acks_command_warns_that_it_reads_the_receipt_topic_only(
        sqlite_db: Db, tmp_path: Path) -> None:
    # Given a producer database and a SQL transport
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", mq]).exit_code == 0
    args = ["--url", sqlite_db.url, "--outbox-table", sqlite_db.names.outbox,
            "--receipt-table", sqlite_db.names.receipts, "--producer", "orders",
            "--transport", f"sql+{mq}", "--burst"]
    # When receipts are applied under the old name and the new one
    old = CliRunner().invoke(app, ["acks", *args])
    new = CliRunner().invoke(app, ["receipts", *args])
    # Then both apply receipts (exit 0), and the old name says what changed
    assert old.exit_code == 0 and new.exit_code == 0, old.output + new.output
    assert "ckit-receipt-orders" in old.stderr and "ckit-ack-orders" in old.stderr
    assert "ckit-ack-orders" not in new.stderr
