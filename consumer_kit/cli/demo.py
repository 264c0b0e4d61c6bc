"""`ckit demo`: the whole loop on embedded defaults (SQLite, the SQL transport, no server)."""

from __future__ import annotations

from pathlib import Path

import typer

from consumer_kit.cli.output import print_table
from consumer_kit.cli.runtime import friendly_errors


@friendly_errors
def demo(
    orders: int = typer.Option(20, "--orders", min=2, help="orders the order service places"),
    workdir: Path | None = typer.Option(None, "--dir", help="keep the SQLite files here"),
    redis: str | None = typer.Option(None, "--redis", envvar="CKIT_REDIS_URL",
                                     help="Redis URL for the fast path (default: database only)"),
    engine: str = typer.Option("auto", "--engine",
                               help="reconciler: spark, sql, or auto (spark when available)"),
) -> None:
    """Publish through the outbox, relay, consume with dedupe, ack, reconcile: with duplicates
    and a lost ack injected on purpose. Exits 1 if any effect was not applied exactly once."""
    from consumer_kit.cli.demo_flow import run_demo

    result = run_demo(orders=orders, workdir=workdir, redis_url=redis, engine=engine,
                      say=typer.echo)
    typer.echo("")
    print_table(["", "count", "what it means"], result.rows)
    typer.echo("")
    if result.ok:
        typer.echo("exactly once in effect: every valid order reserved stock once; "
                   "every outbox row ended CONSUMED or REJECTED.")
    else:
        typer.echo("CHECK FAILED: the counts above do not add up (see the lines marked)")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
