"""`ckit db`: create the tables (`init`) or print their DDL (`ddl`)."""

from __future__ import annotations

import typer

from consumer_kit.cli.common import db_url_option, friendly_errors, json_option, print_json, require
from consumer_kit.db import make_engine
from consumer_kit.ddl import DIALECTS, init_db, render_ddl, schema_metadata
from consumer_kit.schema import (
    DEFAULT_ACK_TABLE,
    DEFAULT_MQ_PREFIX,
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_PROCESSED_TABLE,
    TableNames,
)
from consumer_kit.urls import mask_url

db_app = typer.Typer(help="Database schema: create the tables or print their DDL.",
                     no_args_is_help=True)


def table_names(outbox: str, ack: str, processed: str, mq_prefix: str) -> TableNames:
    """Validated table names from the options (`ConfigError` on a bad identifier)."""
    return TableNames(outbox=outbox, outbox_ack=ack, processed=processed, mq_prefix=mq_prefix)


OUTBOX_OPT = typer.Option(DEFAULT_OUTBOX_TABLE, "--outbox-table", envvar="CKIT_OUTBOX_TABLE",
                          help="outbox table name (its archive is <name>_archive)")
ACK_OPT = typer.Option(DEFAULT_ACK_TABLE, "--ack-table", envvar="CKIT_ACK_TABLE",
                       help="outbox ack table name")
PROCESSED_OPT = typer.Option(DEFAULT_PROCESSED_TABLE, "--processed-table",
                             envvar="CKIT_PROCESSED_TABLE", help="processed table name")
MQ_PREFIX_OPT = typer.Option(DEFAULT_MQ_PREFIX, "--mq-prefix", envvar="CKIT_MQ_PREFIX",
                             help="name prefix of the SQL transport's tables")


@db_app.command("init")
@friendly_errors
def init_cmd(
    url: str | None = db_url_option(),
    outbox_table: str = OUTBOX_OPT,
    ack_table: str = ACK_OPT,
    processed_table: str = PROCESSED_OPT,
    mq_prefix: str = MQ_PREFIX_OPT,
    as_json: bool = json_option(),
) -> None:
    """Create every missing table and index (idempotent: existing tables are left alone)."""
    url = require(url, "--url", "CKIT_DB_URL")
    names = table_names(outbox_table, ack_table, processed_table, mq_prefix)
    engine = make_engine(url)
    try:
        created = init_db(engine, names)
    finally:
        engine.dispose()
    every = sorted(schema_metadata(names).tables)
    present = [name for name in every if name not in created]
    if as_json:
        print_json({"url": mask_url(url), "created": created, "already_present": present})
        return
    typer.echo(f"database: {mask_url(url)}")
    for name in every:
        typer.echo(f"  {name}: {'created' if name in created else 'already present'}")
    typer.echo(f"{len(created)} created, {len(present)} already present")


@db_app.command("ddl")
@friendly_errors
def ddl_cmd(
    dialect: str = typer.Option("mysql", "--dialect", help=f"one of {', '.join(DIALECTS)}"),
    outbox_table: str = OUTBOX_OPT,
    ack_table: str = ACK_OPT,
    processed_table: str = PROCESSED_OPT,
    mq_prefix: str = MQ_PREFIX_OPT,
) -> None:
    """Print the CREATE TABLE / CREATE INDEX statements of every table for a dialect."""
    names = table_names(outbox_table, ack_table, processed_table, mq_prefix)
    typer.echo(render_ddl(dialect, names), nl=False)


def register(app: typer.Typer) -> None:
    """Add the `db` sub-command group to the `ckit` app."""
    app.add_typer(db_app, name="db")


__all__ = ["db_app", "register", "table_names"]
