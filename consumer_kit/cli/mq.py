"""`ckit mq`: housekeeping of the SQL transport's tables."""

from __future__ import annotations

import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json
from consumer_kit.cli.runtime import friendly_errors, require
from consumer_kit.core.clock import duration_text, parse_duration, unit_note, utcnow
from consumer_kit.core.errors import ConfigError
from consumer_kit.transports.sql import SqlTransport
from consumer_kit.transports.sql.retention import PURGE_FLOOR

mq_app = typer.Typer(help="the SQL transport's message tables", no_args_is_help=True)

FLOOR_TEXT = duration_text(PURGE_FLOOR)


@mq_app.command("purge")
@friendly_errors
def purge(
    transport: str | None = options.transport(),
    older_than: str = typer.Option("3d", "--older-than",
                                   help="delete consumed messages stored before now minus this "
                                        f"(at least {FLOOR_TEXT} unless --force)"),
    batch: int = typer.Option(1000, "--batch", min=1, help="rows per delete"),
    mq_prefix: str = options.mq_prefix(),
    force: bool = typer.Option(False, "--force",
                               help=f"allow --older-than under {FLOOR_TEXT}"),
    as_json: bool = options.json_output(),
) -> None:
    """Delete old messages from the SQL transport (its time-based retention, run from cron).

    Only messages that every consumer group known for their topic has consumed go (a group is
    known once it started on the topic: it holds an offset there); a topic no group consumes yet
    keeps everything, and the run says which groups hold messages back. A retired group holds
    its topics' messages back until its rows leave the <prefix>_offset and <prefix>_queue_lease
    tables.

    --older-than must be at least {floor} unless --force: offsets cannot show a group that has
    not started yet (it reads a topic from its oldest kept message), senders' clocks
    (born_at) may run ahead, and an operator may look for a message just sent.
    """
    window = parse_duration(older_than, option="--older-than")
    if window < PURGE_FLOOR and not force:
        raise ConfigError(f"--older-than {older_than}{unit_note(older_than)} is under the "
                          f"safety floor of {FLOOR_TEXT} "
                          "(a group that has not started yet would miss what is deleted): "
                          "pass --force to go below it")
    url = require(transport, "--transport", "CKIT_TRANSPORT")
    if not url.startswith("sql+"):
        raise ConfigError("ckit mq purge works on sql+<db-url> transports only")
    target = SqlTransport(url[len("sql+"):], table_prefix=mq_prefix)
    try:
        result = target.purge(utcnow() - window, batch=batch)
    finally:
        target.close()
    if as_json:
        print_json(result.to_dict())
        return
    typer.echo(f"deleted {result.deleted} messages stored before now - {older_than} that every "
               "group consumed")
    for topic, count in sorted(result.kept.items()):
        why = ("no group consumes it yet" if topic in result.unconsumed_topics
               else "not consumed yet by " + ", ".join(result.behind.get(topic, [])))
        typer.echo(f"kept {count} of topic {topic}: {why}")


purge.__doc__ = (purge.__doc__ or "").replace("{floor}", FLOOR_TEXT)


def register(app: typer.Typer) -> None:
    """Add `mq` to the CLI."""
    app.add_typer(mq_app, name="mq")
