"""`ckit mq purge`: time-based retention of the SQL transport."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.sql import SqlTransport


def test_purge_deletes_only_messages_older_than_the_horizon(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'mq.db'}"
    transport = SqlTransport(url, create_tables=True)
    transport.send(OutgoingMessage("T", b"old"))
    transport.close()
    runner = CliRunner()
    kept = runner.invoke(app, ["mq", "purge", "--transport", f"sql+{url}", "--older-than", "1h"])
    assert kept.exit_code == 0, kept.output
    assert "deleted 0 messages" in kept.output
    gone = runner.invoke(app, ["mq", "purge", "--transport", f"sql+{url}", "--older-than", "0s",
                               "--json"])
    assert gone.exit_code == 0, gone.output
    assert '"deleted": 1' in gone.output


def test_purge_refuses_a_transport_that_is_not_sql() -> None:
    result = CliRunner().invoke(app, ["mq", "purge", "--transport", "memory://"])
    assert result.exit_code == 2
    assert "sql+<db-url> transports only" in result.output
