"""`ckit mq`: housekeeping of the SQL transport's tables."""

from __future__ import annotations

import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json
from consumer_kit.cli.runtime import friendly_errors, require
from consumer_kit.core.clock import parse_duration, utcnow
from consumer_kit.core.errors import ConfigError
from consumer_kit.transports import open_transport
from consumer_kit.transports.sql import SqlTransport

mq_app = typer.Typer(help="the SQL transport's message tables", no_args_is_help=True)


@mq_app.command("purge")
@friendly_errors
def purge(
    transport: str | None = options.transport(),
    older_than: str = typer.Option("3d", "--older-than",
                                   help="delete messages stored before now minus this"),
    batch: int = typer.Option(1000, "--batch", min=1, help="rows per delete"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Delete old messages from the SQL transport, like RocketMQ's time-based retention.

    Keep --older-than well past your consumers' lag: a message deleted before a group read it
    is gone for that group (the outbox still has it; `ckit reconcile` re-sends what was never
    consumed)."""
    url = require(transport, "--transport", "CKIT_TRANSPORT")
    target = open_transport(url)
    try:
        if not isinstance(target, SqlTransport):
            raise ConfigError("ckit mq purge works on sql+<db-url> transports only")
        deleted = target.purge(utcnow() - parse_duration(older_than), batch=batch)
    finally:
        target.close()
    if as_json:
        print_json({"deleted": deleted})
    else:
        typer.echo(f"deleted {deleted} messages stored before now - {older_than}")


def register(app: typer.Typer) -> None:
    """Add `mq` to the CLI."""
    app.add_typer(mq_app, name="mq")
