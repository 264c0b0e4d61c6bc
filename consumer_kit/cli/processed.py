"""`ckit processed purge`: keep the processed table bounded, in step with the Redis TTL."""

from __future__ import annotations

import logging

import sqlalchemy as sa
import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json
from consumer_kit.cli.runtime import existing_database, friendly_errors
from consumer_kit.core.clock import parse_duration, unit_note
from consumer_kit.core.db import check_tables
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import GROUP_LEN
from consumer_kit.processed import PURGE_FLOOR, ProcessedStore

log = logging.getLogger(__name__)

processed_app = typer.Typer(help="the consumer's processed-messages table", no_args_is_help=True)


@processed_app.command("purge")
@friendly_errors
def purge(
    url: str | None = options.url("SQLAlchemy URL of the consumer database (env CKIT_DB_URL)"),
    group: str = typer.Option(..., "--group", help="consumer group whose rows to purge"),
    older_than: str = typer.Option("7d", "--older-than",
                                   help="delete rows processed before now minus this"),
    batch: int = typer.Option(1000, "--batch", min=1, help="rows per delete"),
    max_batches: int | None = typer.Option(
        None, "--max-batches", min=1,
        help="stop after this many deletes (a bounded run; the next run goes on)"),
    pause: str = typer.Option("0", "--pause", help="wait between batches (e.g. 50ms): lets "
                              "purge and replication keep up on a busy server"),
    processed_table: str = options.processed_table(),
    force: bool = typer.Option(False, "--force", help=f"allow --older-than under the safety "
                               f"floor of {PURGE_FLOOR.days} days"),
    as_json: bool = options.json_output(),
) -> None:
    """Delete old processed rows in bounded batches (rows still owing a receipt are kept).

    A processed row is what makes a late duplicate a duplicate: purged too early, a redelivery
    or a re-send applies the effect again. --older-than under the safety floor (7 days: the
    Redis done TTL, well past RocketMQ's redelivery horizon of about 5 hours and the relay's
    retries) is refused unless --force.
    """
    if not group.strip() or len(group) > GROUP_LEN:
        raise ConfigError(f"--group must name a consumer group (1-{GROUP_LEN} characters), "
                          f"not {group!r}")
    window = parse_duration(older_than, option="--older-than")
    if window < PURGE_FLOOR and not force:
        raise ConfigError(
            f"--older-than {older_than}{unit_note(older_than)} is under the safety floor of "
            f"{PURGE_FLOOR.days} days: "
            "a redelivery after the purge would apply its effect again (--force to purge "
            "anyway)")
    engine = existing_database(url)
    store = ProcessedStore(engine, group, table=processed_table)
    check_tables(engine, store.table)
    deleted = store.purge(window, batch=batch, max_batches=max_batches,
                          pause=parse_duration(pause, option="--pause").total_seconds())
    if not deleted:
        _warn_if_unknown(store, group)
    # every allowed batch came back full: rows past the window may be left for the next run
    more = max_batches is not None and deleted >= batch * max_batches
    if as_json:
        print_json({"deleted": deleted, "group": group, "more": more})
    else:
        typer.echo(f"deleted {deleted} processed rows of group {group}"
                   + (f"; stopped at --max-batches {max_batches}: older rows may be left, the "
                      "next run goes on" if more else ""))


def _warn_if_unknown(store: ProcessedStore, group: str) -> None:
    """Say so when the table holds no row of `group` at all (one primary-key seek): a
    misspelt group in a cron line would purge nothing, run after run, and the table grow."""
    t = store.table
    with store.engine.connect() as conn:
        found = conn.execute(sa.select(sa.literal(1)).where(t.c.consumer_group == group)
                             .limit(1)).first()
    if found is None:
        log.warning("%s holds no row of group %r: check --group (a misspelt group purges "
                    "nothing)", t.name, group)


def register(app: typer.Typer) -> None:
    """Add `processed` to the CLI."""
    app.add_typer(processed_app, name="processed")
