"""`ckit outbox partitions`: a day-partitioned outbox on MySQL/MariaDB (create, rotate, show).
The operations live in `outbox_producer.ops.partitions`; this module parses and prints."""

from __future__ import annotations

import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json, print_table
from consumer_kit.cli.runtime import existing_database, friendly_errors
from consumer_kit.core.clock import parse_duration
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import TableNames
from outbox_producer.ops import ARCHIVE_FLOOR, OutboxTables, check_archive_floor
from outbox_producer.ops import partitions as parts

partitions_app = typer.Typer(
    help="A day-partitioned outbox (MySQL/MariaDB): old days are dropped, not deleted.",
    no_args_is_help=True)


def _tables(outbox_table: str, receipt_table: str) -> OutboxTables:
    return OutboxTables.from_names(TableNames(outbox=outbox_table, receipts=receipt_table))


@partitions_app.command("create")
@friendly_errors
def create_cmd(
    days_ahead: int = typer.Option(parts.DEFAULT_DAYS_AHEAD, "--days-ahead", min=0,
                                   help="partitions for today and this many more days"),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
) -> None:
    """Create the outbox partitioned by day of message_id, with its key table and trigger."""
    engine = existing_database(url)
    made = parts.create(engine, _tables(outbox_table, receipt_table), days_ahead=days_ahead)
    typer.echo(f"created {outbox_table} with partitions {', '.join(made)}")


@partitions_app.command("rotate")
@friendly_errors
def rotate_cmd(
    days_ahead: int = typer.Option(parts.DEFAULT_DAYS_AHEAD, "--days-ahead", min=0,
                                   help="make sure partitions exist this many days ahead"),
    older_than: str = typer.Option(f"{parts.DEFAULT_OLDER_THAN.days}d", "--older-than",
                                   help="retire day partitions that ended this long ago"),
    batch: int = typer.Option(parts.DEFAULT_BATCH, "--batch", min=1,
                              help="rows per archive copy and per receipt/key delete"),
    pause: str = typer.Option("0", "--pause", help="wait between batches, e.g. 50ms"),
    include_rejected: bool = typer.Option(False, "--include-rejected",
                                          help="drop partitions whose open rows are REJECTED"),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    force: bool = typer.Option(False, "--force", help="allow --older-than under the safety "
                               f"floor of {ARCHIVE_FLOOR.days} days"),
    as_json: bool = options.json_output(),
) -> None:
    """Add the coming days' partitions; archive and drop old days whose rows are all CONSUMED.

    Run it daily from cron. A partition with other rows is kept and named in the output. A
    dropped day's keys can be published again: a horizon under the safety floor (7 days, as
    for archive) is refused unless --force.
    """
    horizon = parse_duration(older_than, option="--older-than")
    check_archive_floor(horizon, option=older_than, force=force, verb="rotate")
    engine = existing_database(url)
    result = parts.rotate(engine, _tables(outbox_table, receipt_table), days_ahead=days_ahead,
                          older_than=horizon, batch=batch,
                          pause=parse_duration(pause, option="--pause").total_seconds(),
                          include_rejected=include_rejected)
    if as_json:
        print_json(result.to_dict())
        return
    typer.echo(f"added {', '.join(result.added) or 'none'}; dropped "
               f"{', '.join(result.dropped) or 'none'} ({result.archived} rows archived)")
    for name, why in result.kept.items():
        typer.echo(f"kept {name}: {why}")


@partitions_app.command("show")
@friendly_errors
def show_cmd(
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    as_json: bool = options.json_output(),
) -> None:
    """The outbox's partitions, their upper bounds and estimated rows."""
    engine = existing_database(url)
    found = parts.partitions(engine, outbox_table)
    if not found:
        raise ConfigError(f"table {outbox_table} is not partitioned (ckit outbox partitions "
                          "create makes a partitioned outbox)")
    if as_json:
        print_json([p.__dict__ for p in found])
        return
    print_table(["partition", "below message_id", "rows (estimate)"],
                [(p.name, p.upper, p.rows) for p in found])
