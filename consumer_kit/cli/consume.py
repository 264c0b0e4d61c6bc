"""`ckit consume MODULE:APP`: run a ConsumerApp."""

from __future__ import annotations

import importlib
import logging
import math
import sys
import threading
from pathlib import Path

import typer

from consumer_kit.app import ConsumerApp
from consumer_kit.cli import options
from consumer_kit.cli.runtime import (
    EXIT_STALLED,
    exit_if_native_shutdown_hangs,
    friendly_errors,
    on_shutdown,
    serve_metrics,
    signalled_line,
)
from consumer_kit.cli.transports import open_for_processes
from consumer_kit.core.errors import ConfigError, ConsumerStalled
from consumer_kit.core.schema import DEFAULT_MQ_PREFIX
from consumer_kit.outcome import Outcome
from consumer_kit.transports.base import Transport

log = logging.getLogger(__name__)


def load_app(target: str) -> ConsumerApp:
    """Import `module:attribute` and return the ConsumerApp it names.

    Raises:
        ConfigError: the module or attribute is missing, or is not a ConsumerApp.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"invalid app {target!r}: use MODULE:APP, e.g. examples.inventory:app")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, ConsumerApp):
        raise ConfigError(f"{target} is {type(app).__name__}, not a ConsumerApp")
    return app


@friendly_errors
def consume(
    ctx: typer.Context,
    app_path: str = typer.Argument(..., metavar="MODULE:APP", help="e.g. examples.inventory:app"),
    transport: str | None = options.transport(),
    mq_prefix: str = options.mq_prefix(),
    burst: bool = options.burst(),
    threads: int | None = typer.Option(None, "--threads", min=1, help="consumer threads"),
    metrics_port: int | None = options.metrics_port(),
    max_seconds: float | None = typer.Option(None, "--max-seconds",
                                             help="stop after this long (tests, demos)"),
) -> None:
    """Run the app's listeners: dedupe, handle, ack. SIGTERM/SIGINT finish in-flight messages.

    Exits 3 when a RocketMQ consumer stalled (no message while its queues hold a backlog) and
    rebuilding it did not help, so that a supervisor restarts the process; a native shutdown
    that does not return within its bound does not keep the process from exiting."""
    if max_seconds is not None and not 0 < max_seconds < math.inf:
        raise ConfigError(f"--max-seconds must be a positive, finite number of seconds, not "
                          f"{max_seconds:g}")
    app = load_app(app_path)
    if transport is not None and isinstance(app.transport_config, Transport) \
            and _source(ctx, "transport") == "ENVIRONMENT":
        # the variable the relay and receipts read too: the app's own object is kept (an
        # explicit --transport replacing it is refused by `ConsumerApp.transport`)
        log.warning("CKIT_TRANSPORT is set, but app %s builds its own %s: using the app's",
                    app_path, type(app.transport_config).__name__)
        transport = None
    if mq_prefix != DEFAULT_MQ_PREFIX and transport is None \
            and isinstance(app.transport_config, Transport) \
            and _source(ctx, "mq_prefix") == "ENVIRONMENT":
        log.warning("CKIT_MQ_PREFIX is set, but app %s builds its own %s: using the app's",
                    app_path, type(app.transport_config).__name__)
        mq_prefix = DEFAULT_MQ_PREFIX
    source = app.transport(_with_prefix(app, transport, mq_prefix))
    if not source.shared_across_processes:
        raise ConfigError(f"ckit consume cannot use {source.scheme}:// (it reaches only its "
                          "own process): use sql+<db-url>, rocketmq://namesrv:port or "
                          "rocketmq5://proxy:port")
    serve_metrics(metrics_port)
    stop = threading.Event()
    on_shutdown(stop.set)
    try:
        left = app.run(transport=source, burst=burst, stop=stop, threads=threads,
                       max_seconds=max_seconds)
    except ConsumerStalled as exc:
        app.close()
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        exit_if_native_shutdown_hangs(EXIT_STALLED)
        raise typer.Exit(EXIT_STALLED) from None
    finally:
        app.close()
    counts = app.pipeline().counts
    typer.echo("  ".join(f"{o.value}={counts[o]}" for o in Outcome))
    if left:
        typer.echo(f"left {left} handler(s) running at exit: their transactions did not "
                   "commit and the broker redelivers their messages", err=True)
    said = signalled_line("--burst", "its topics: what it handled stays done, the rest waits "
                          "on the broker") if burst else None
    if said is not None:
        typer.echo(f"error: {said[0]}", err=True)
    # offsets the native client did not persist are redelivered (and deduped) after a restart
    exit_if_native_shutdown_hangs(said[1] if said else 0)
    if said is not None:
        raise typer.Exit(said[1])


def _with_prefix(app: ConsumerApp, transport: str | None, mq_prefix: str
                 ) -> str | Transport | None:
    """The transport to give `app.transport`: with a `--mq-prefix` (or CKIT_MQ_PREFIX) other
    than the default, the SQL transport of the URL in use opened on those tables (the relay
    and `ckit receipts` take it too: ignoring it here would poll other, maybe empty, tables).

    Raises:
        ConfigError: such a prefix with a transport that is not a `sql+` URL (another scheme,
            or a Transport object the app builds itself).
    """
    if mq_prefix == DEFAULT_MQ_PREFIX:
        return transport
    url = transport if transport is not None else app.transport_config
    if not isinstance(url, str):
        raise ConfigError(f"--mq-prefix {mq_prefix!r} names the SQL transport's tables, but "
                          f"ckit consume would use the {type(url).__name__} app {app.group} "
                          "builds itself: drop it (or unset CKIT_MQ_PREFIX), or build "
                          "SqlTransport(url, table_prefix=...) in the app")
    return open_for_processes(url, command="ckit consume", mq_prefix=mq_prefix)


def _source(ctx: typer.Context, name: str) -> str | None:
    """Where option `name` got its value ("COMMANDLINE", "ENVIRONMENT", ...), by name: typer
    may bring its own click, whose enum is not the installed click's."""
    return getattr(ctx.get_parameter_source(name), "name", None)


def register(app: typer.Typer) -> None:
    """Add `consume` to the CLI."""
    app.command("consume")(consume)
