"""`ckit db`: create the tables (`init`) or print their DDL (`ddl`)."""

from __future__ import annotations

import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json
from consumer_kit.cli.runtime import friendly_errors, require
from consumer_kit.core.db import make_engine
from consumer_kit.core.ddl import DIALECTS, init_db, render_ddl, schema_metadata
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import (
    TableNames,
)
from consumer_kit.core.urls import mask_url

db_app = typer.Typer(help="Database schema: create the tables or print their DDL.",
                     no_args_is_help=True)


def table_names(outbox: str, ack: str, processed: str, mq_prefix: str) -> TableNames:
    """Validated table names from the options (`ConfigError` on a bad identifier)."""
    return TableNames(outbox=outbox, receipts=ack, processed=processed, mq_prefix=mq_prefix)





@db_app.command("init")
@friendly_errors
def init_cmd(
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    processed_table: str = options.processed_table(),
    mq_prefix: str = options.mq_prefix(),
    upgrade: bool = typer.Option(False, "--upgrade", help="add the columns and indexes a table "
                                 "made by an older consumer-kit lacks"),
    as_json: bool = options.json_output(),
) -> None:
    """Create every missing table and index (idempotent: existing tables are left alone). A
    table made by an older version that lacks columns is refused, naming them; `--upgrade`
    adds them."""
    url = require(url, "--url", "CKIT_DB_URL")
    names = table_names(outbox_table, receipt_table, processed_table, mq_prefix)
    engine = make_engine(url)
    if engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:"):
        engine.dispose()
        raise ConfigError("an in-memory SQLite database ends with this command: give a file "
                          "(sqlite:///path.db)")
    try:
        created = init_db(engine, names, upgrade=upgrade)
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
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    processed_table: str = options.processed_table(),
    mq_prefix: str = options.mq_prefix(),
) -> None:
    """Print the CREATE TABLE / CREATE INDEX statements of every table for a dialect."""
    names = table_names(outbox_table, receipt_table, processed_table, mq_prefix)
    typer.echo(render_ddl(dialect, names), nl=False)


def register(app: typer.Typer) -> None:
    """Add the `db` sub-command group to the `ckit` app."""
    app.add_typer(db_app, name="db")


__all__ = ["db_app", "register", "table_names"]
