"""`ckit demo`: the whole loop on embedded defaults (SQLite, the SQL transport, no server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from consumer_kit.cli.demo_facts import DEMO_FILES, MIN_ORDERS
from consumer_kit.cli.output import print_table
from consumer_kit.cli.runtime import friendly_errors, writable_folder
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.urls import mask_url

ENGINE_CHOICES = ("auto", "spark", "sql")
REDIS_CHECK_TIMEOUT = 3.0


@friendly_errors
def demo(
    orders: int = typer.Option(20, "--orders", min=MIN_ORDERS,
                               help="orders the order service places"),
    workdir: Path | None = typer.Option(None, "--dir", help="keep the SQLite files here"),
    redis: str | None = typer.Option(None, "--redis", envvar="CKIT_REDIS_URL",
                                     help="Redis URL for the fast path (default: database only)"),
    engine: str = typer.Option("auto", "--engine",
                               help="reconciler: spark, sql, or auto (spark when available)"),
) -> None:
    """Publish through the outbox, relay, consume with dedupe, send receipts, reconcile: with
    duplicates and a lost receipt injected on purpose. Exits 1 if any effect was not applied
    exactly once. Every option is checked before the first step (one line, exit 2)."""
    chosen = check_engine(engine)
    if workdir is not None:
        writable_folder(workdir, option="--dir")
        held = [name for name in DEMO_FILES if (workdir / name).exists()]
        if held:
            raise ConfigError(f"--dir {str(workdir)!r} holds a demo run's {', '.join(held)}: "
                              "give an empty folder, or remove them first")
    if redis is not None:
        check_redis(redis)
    from consumer_kit.cli.demo_flow import run_demo

    result = run_demo(orders=orders, workdir=workdir, redis_url=redis, engine=chosen,
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


def check_engine(choice: str) -> str:
    """The reconcile engine to use: `auto` is Spark when pyspark, java and the SQLite JDBC
    driver are all there, else SQL.

    Raises:
        ConfigError: an unknown choice, or `spark` without what it needs (naming what).
    """
    if choice not in ENGINE_CHOICES:
        raise ConfigError(f"--engine {choice!r}: use one of {', '.join(ENGINE_CHOICES)}")
    if choice == "sql":
        return choice
    missing = _spark_missing()
    if missing is None:
        return "spark"
    if choice == "spark":
        raise ConfigError(f"--engine spark: {missing} (or use --engine sql)")
    return "sql"


def _spark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed: pip install 'consumer-kit[spark]'"
    if shutil.which("java") is None:
        return "no java on PATH"
    from spark.jdbc import find_jars

    try:
        find_jars({"sqlite"})
    except ConfigError as exc:
        return str(exc)
    return None


def check_redis(url: str) -> None:
    """Ping Redis once, so a bad `--redis` fails before the first step.

    Raises:
        ConfigError: naming `--redis` (password masked); an empty one too.
    """
    if not url.strip():  # `--redis "$REDIS_URL"` with the variable unset
        raise ConfigError(f"--redis {url!r} is empty: give a Redis URL (redis://host:6379/0), "
                          "or leave --redis out for the database only")
    import redis as redis_lib

    from consumer_kit.dedupe.packer import client_options

    try:
        client = redis_lib.Redis.from_url(url, socket_connect_timeout=REDIS_CHECK_TIMEOUT,
                                          socket_timeout=REDIS_CHECK_TIMEOUT,
                                          **client_options())
        try:
            client.ping()
        finally:
            client.close()
    except (ValueError, redis_lib.RedisError) as exc:
        raise ConfigError(f"--redis {mask_url(url)}: {type(exc).__name__}: {exc}") from None


def register(app: typer.Typer) -> None:
    """Add `demo` to the CLI."""
    app.command("demo")(demo)
