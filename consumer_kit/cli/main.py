"""`ckit`: the entry point. Each subcommand lives in its own module with a `register(app)`."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from consumer_kit.cli.runtime import OneLineGroup, configure_logging, one_value_options

app = typer.Typer(
    name="ckit",
    help="consumer-kit: exactly-once in effect delivery over RocketMQ (outbox, dedupe, reconcile).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineGroup,
)

SUBCOMMAND_MODULES = (
    "db", "outbox", "relay", "receipts", "consume", "processed", "mq", "reconcile", "demo",
)


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="more logging (-vv: debug)"),
) -> None:
    configure_logging(verbose)


for _name in SUBCOMMAND_MODULES:
    importlib.import_module(f"consumer_kit.cli.{_name}").register(app)
one_value_options(app)  # `--url A --url B` on a command of one database: refused, not B alone


def main() -> None:
    """Console-script entry point. Output piped into a reader that stops early (`| head`) ends
    quietly instead of with a BrokenPipeError traceback."""
    try:
        app()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        sys.exit(1)


if __name__ == "__main__":
    main()
