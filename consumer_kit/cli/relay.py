"""`ckit relay`: send what is due in the outbox."""

from __future__ import annotations

import math

import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_totals
from consumer_kit.cli.runtime import (
    EXIT_FAILURE,
    friendly_errors,
    on_shutdown,
    require,
    serve_metrics,
)
from consumer_kit.cli.transports import open_for_processes
from consumer_kit.core.clock import parse_duration
from consumer_kit.core.db import check_tables, make_engine
from consumer_kit.core.errors import ConfigError
from outbox_producer.claim import DEFAULT_LEASE, Shard
from outbox_producer.relay import DEFAULT_BATCH, DEFAULT_ONCE_OUTAGE_LIMIT, Relay

LEASE_TEXT = f"{DEFAULT_LEASE.total_seconds():g}s"


@friendly_errors
def relay(
    url: str | None = options.url(),
    transport: str | None = options.transport(),
    once: bool = typer.Option(False, "--once", help="drain what is due, then exit"),
    batch: int = typer.Option(DEFAULT_BATCH, "--batch", min=1, help="rows claimed per batch"),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="claim/send loops in this process (they never overlap)"),
    shard: str | None = typer.Option(None, "--shard", help="i/N: only rows with MOD(id, N) = i"),
    max_rate: float | None = typer.Option(None, "--max-rate", help="cap on sends per second"),
    lease: str = typer.Option(LEASE_TEXT, "--lease",
                              help="send lease; expired leases are reclaimed"),
    retry_failed_after: str | None = typer.Option(
        None, "--retry-failed-after", help="slow retry of FAILED rows after this long (e.g. 1h)"),
    give_up_after: str = typer.Option(
        f"{DEFAULT_ONCE_OUTAGE_LIMIT:g}s", "--give-up-after",
        help="with --once: exit 1 when the broker or database stays down this long"),
    outbox_table: str = options.outbox_table(),
    as_json: bool = options.json_output(),
    metrics_port: int | None = options.metrics_port(),
) -> None:
    """Claim due outbox rows, send them, mark SENT (or retry with back-off, or FAILED).

    A misconfiguration (a missing table, a transport that cannot reach other processes, a bad
    option) fails with one line and exit 2 before any row moves. With --once, an outage that
    outlasts --give-up-after ends the run with exit 1; nothing is charged a retry for it.
    """
    if max_rate is not None and not (math.isfinite(max_rate) and max_rate > 0):
        raise ConfigError(f"--max-rate must be a positive number of sends per second, "
                          f"not {max_rate}")
    lease_time = parse_duration(lease, option="--lease")
    failed_after = (parse_duration(retry_failed_after, option="--retry-failed-after")
                    if retry_failed_after else None)
    limit = parse_duration(give_up_after, option="--give-up-after").total_seconds()
    shard_spec = Shard.parse(shard) if shard else None
    db = make_engine(require(url, "--url", "CKIT_DB_URL"))
    target = open_for_processes(require(transport, "--transport", "CKIT_TRANSPORT"),
                                command="ckit relay")
    try:
        worker = Relay(db, target, table=outbox_table, batch=batch, workers=workers,
                       max_rate=max_rate, shard=shard_spec, lease=lease_time,
                       failed_retry_after=failed_after, once_outage_limit=limit)
        check_tables(db, worker.table)
        target.check()
        on_shutdown(worker.stop)
        serve_metrics(metrics_port)  # after the handlers: a scrape means SIGTERM is safe
        result = worker.run(once=once)
    finally:
        target.close()
    totals = {"batches": result.batches, "sent": result.stats.sent,
              "retried": result.stats.retried, "failed": result.stats.failed,
              "conflicts": result.stats.conflicts, "errors": result.errors}
    print_totals(totals, as_json)
    if result.gave_up:
        typer.echo(f"error: gave up after --give-up-after {give_up_after}: {result.gave_up}",
                   err=True)
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Add `relay` to the CLI."""
    app.command("relay")(relay)
