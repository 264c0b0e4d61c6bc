"""`ckit mq purge`: time-based retention of the SQL transport."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.messages import ConsumeStatus, Subscription
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.sql import SqlTransport


def consume_all(transport: SqlTransport, group: str, topic: str) -> None:
    """Run a consumer of `group` until it has committed every message of `topic`."""
    consumer = transport.consumer(group, [Subscription(topic, "*")],
                                  lambda _d: ConsumeStatus.CONSUME_SUCCESS)
    off = transport.tables.offset
    consumer.start()
    try:
        assert wait_for(lambda: transport.db.run(lambda conn: conn.execute(
            sa.select(sa.func.sum(off.c.committed_offset)).where(
                off.c.consumer_group == group, off.c.topic == topic)).scalar(),
            write=False, what="test") == 1, 20)
    finally:
        consumer.shutdown()


def test_purge_deletes_only_messages_older_than_the_horizon(tmp_path: Path) -> None:
    # Given a message a group has consumed (purge never deletes what a group has not)
    url = f"sqlite:///{tmp_path / 'mq.db'}"
    transport = SqlTransport(url, create_tables=True)
    transport.send(OutgoingMessage("T", b"old"))
    consume_all(transport, "g", "T")
    transport.close()
    runner = CliRunner()
    kept = runner.invoke(app, ["mq", "purge", "--transport", f"sql+{url}", "--older-than", "1h"])
    assert kept.exit_code == 0, kept.output
    assert "deleted 0 messages" in kept.output
    # (a window under the one-hour safety floor needs --force)
    gone = runner.invoke(app, ["mq", "purge", "--transport", f"sql+{url}", "--older-than", "0s",
                               "--force", "--json"])
    assert gone.exit_code == 0, gone.output
    assert '"deleted": 1' in gone.output


def test_purge_refuses_a_transport_that_is_not_sql() -> None:
    result = CliRunner().invoke(app, ["mq", "purge", "--transport", "memory://"])
    assert result.exit_code == 2
    assert "sql+<db-url> transports only" in result.output
