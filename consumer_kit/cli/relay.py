"""`ckit relay`: send what is due in the outbox."""

from __future__ import annotations

import typer

from consumer_kit.cli.common import (
    db_url_option,
    friendly_errors,
    print_totals,
    require,
    transport_option,
)
from consumer_kit.cli.signals import on_shutdown
from consumer_kit.clock import parse_duration
from consumer_kit.db import check_tables, make_engine
from consumer_kit.schema import DEFAULT_OUTBOX_TABLE
from consumer_kit.transports import open_transport
from outbox_producer.claim import Shard
from outbox_producer.relay import DEFAULT_BATCH, DEFAULT_LEASE, Relay

LEASE_TEXT = f"{DEFAULT_LEASE.total_seconds():g}s"


@friendly_errors
def relay(
    url: str | None = db_url_option(),
    transport: str | None = transport_option(),
    once: bool = typer.Option(False, "--once", help="drain what is due, then exit"),
    batch: int = typer.Option(DEFAULT_BATCH, "--batch", min=1, help="rows claimed per batch"),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="claim/send loops in this process (they never overlap)"),
    shard: str | None = typer.Option(None, "--shard", help="i/N: only rows with MOD(id, N) = i"),
    max_rate: float | None = typer.Option(None, "--max-rate", help="cap on sends per second"),
    lease: str = typer.Option(LEASE_TEXT, "--lease",
                              help="SENDING lease; expired leases are reclaimed"),
    retry_failed_after: str | None = typer.Option(
        None, "--retry-failed-after", help="slow retry of FAILED rows after this long (e.g. 1h)"),
    table: str = typer.Option(DEFAULT_OUTBOX_TABLE, "--table", help="outbox table"),
    as_json: bool = typer.Option(False, "--json", help="print the totals as JSON"),
    metrics_port: int | None = typer.Option(None, "--metrics-port",
                                            help="serve Prometheus metrics on this port"),
) -> None:
    """Claim due outbox rows, send them, mark SENT (or retry with back-off, or FAILED)."""
    db = make_engine(require(url, "--url", "CKIT_DB_URL"))
    target = open_transport(require(transport, "--transport", "CKIT_TRANSPORT"))
    worker = Relay(
        db, target, table=table, batch=batch, workers=workers, max_rate=max_rate,
        shard=Shard.parse(shard) if shard else None, lease=parse_duration(lease),
        failed_retry_after=parse_duration(retry_failed_after) if retry_failed_after else None,
    )
    check_tables(db, worker.table)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1")
    on_shutdown(worker.stop)
    try:
        result = worker.run(once=once)
    finally:
        target.close()
    totals = {"batches": result.batches, "sent": result.stats.sent,
              "retried": result.stats.retried, "failed": result.stats.failed,
              "conflicts": result.stats.conflicts, "errors": result.errors}
    print_totals(totals, as_json)


def register(app: typer.Typer) -> None:
    """Add `relay` to the CLI."""
    app.command("relay")(relay)


