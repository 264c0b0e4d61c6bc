"""Every option more than one `ckit` command takes, declared once with its environment variable
(rq's `shared_options`): each command that takes a database URL calls it `--url` / `CKIT_DB_URL`,
each outbox table `--outbox-table` / `CKIT_OUTBOX_TABLE`, and so on.

Each function returns a fresh `typer.Option` to use as a parameter default.
"""

from __future__ import annotations

from typing import Any

import typer

from consumer_kit.core.schema import (
    DEFAULT_MQ_PREFIX,
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_PROCESSED_TABLE,
    DEFAULT_RECEIPT_TABLE,
)

TRANSPORT_HELP = (
    "transport URL: sql+<db-url>, rocketmq://namesrv:port, rocketmq5://proxy:port "
    "(or memory:// in one process) "
    "(env CKIT_TRANSPORT)"
)


def url(help_text: str = "SQLAlchemy URL of the database (env CKIT_DB_URL)") -> Any:
    """`--url` / CKIT_DB_URL: the database the command works on."""
    return typer.Option(None, "--url", envvar="CKIT_DB_URL", help=help_text, show_default=False,
                        callback=_one_url)


def _one_url(value: str | None) -> str | None:
    """Refuse a value holding several URLs: CKIT_DB_URL may list a sharded producer's
    databases, space separated, for `ckit relay`, `ckit receipts` and `ckit reconcile`; a
    command working on one database read the list as one URL (a database named 'orders
    postgresql+psycopg://...', a SQLite folder 'a.db sqlite:'). A lone URL with a space (a
    SQLite path) still passes."""
    count = sum("://" in part for part in (value or "").split())
    if count > 1:
        raise typer.BadParameter(
            f"{count} URLs separated by spaces (CKIT_DB_URL may list several for ckit relay, "
            "receipts and reconcile): this command works on one database, give it one --url")
    return value


def urls(help_text: str) -> Any:
    """`--url` (repeatable) / CKIT_DB_URL (space separated): the databases of a command that
    serves several (a sharded producer)."""
    return typer.Option([], "--url", envvar="CKIT_DB_URL", help=help_text, show_default=False)


def read_urls() -> Any:
    """`--read-url` (repeatable) / CKIT_READ_URL: read replicas of the `--url` databases, in
    the same order."""
    return typer.Option([], "--read-url", envvar="CKIT_READ_URL", show_default=False,
                        help="a read replica of the i-th --url (repeat once per --url): scans "
                             "go there, claims and repairs stay on the primary")


def transport() -> Any:
    """`--transport` / CKIT_TRANSPORT."""
    return typer.Option(None, "--transport", envvar="CKIT_TRANSPORT", help=TRANSPORT_HELP,
                        show_default=False)


def outbox_table() -> Any:
    """`--outbox-table` / CKIT_OUTBOX_TABLE."""
    return typer.Option(DEFAULT_OUTBOX_TABLE, "--outbox-table", envvar="CKIT_OUTBOX_TABLE",
                        help="outbox table name (its archive is <name>_archive)")


def receipt_table() -> Any:
    """`--receipt-table` / CKIT_RECEIPT_TABLE."""
    return typer.Option(DEFAULT_RECEIPT_TABLE, "--receipt-table", envvar="CKIT_RECEIPT_TABLE",
                        help="the outbox's receipt table name")


def processed_table() -> Any:
    """`--processed-table` / CKIT_PROCESSED_TABLE."""
    return typer.Option(DEFAULT_PROCESSED_TABLE, "--processed-table",
                        envvar="CKIT_PROCESSED_TABLE", help="processed table name")


def mq_prefix() -> Any:
    """`--mq-prefix` / CKIT_MQ_PREFIX."""
    return typer.Option(DEFAULT_MQ_PREFIX, "--mq-prefix", envvar="CKIT_MQ_PREFIX",
                        help="name prefix of the SQL transport's tables")


def producer() -> Any:
    """`--producer` / CKIT_PRODUCER (required)."""
    return typer.Option(..., "--producer", envvar="CKIT_PRODUCER",
                        help="producer service name (its receipt topic is ckit-receipt-NAME)")


def group() -> Any:
    """`--group` / CKIT_GROUP (required)."""
    return typer.Option(..., "--group", envvar="CKIT_GROUP", help="consumer group")


def redis() -> Any:
    """`--redis` / CKIT_REDIS_URL."""
    return typer.Option(None, "--redis", envvar="CKIT_REDIS_URL",
                        help="Redis URL for the dedupe fast path (default: database only)")


def metrics_port() -> Any:
    """`--metrics-port` / CKIT_METRICS_PORT: Prometheus metrics on 127.0.0.1."""
    return typer.Option(None, "--metrics-port", envvar="CKIT_METRICS_PORT", min=1, max=65535,
                        help="serve Prometheus metrics on 127.0.0.1:PORT")


def json_output() -> Any:
    """`--json`: machine-readable output on stdout."""
    return typer.Option(False, "--json", help="print JSON instead of a table")


def burst() -> Any:
    """`--burst`: drain what is there, then exit."""
    return typer.Option(False, "--burst", help="drain what is there, then exit")


def force() -> Any:
    """`--force`: allow what could apply an effect twice (each command says what)."""
    return typer.Option(False, "--force", help="go past the safety checks (see the help text)")
