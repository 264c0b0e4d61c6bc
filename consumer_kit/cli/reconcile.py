"""`ckit reconcile`: repair outbox rows stuck past a cutoff (Spark or plain SQL engine).

Exit codes: 0 clean, 3 when a threshold is crossed or a failure class is present (cron alerts),
2 bad options or configuration, 1 an unexpected failure.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json, print_table
from consumer_kit.cli.reconcile_checks import (
    check_clock,
    check_groups,
    check_lag,
    check_left_out,
)
from consumer_kit.cli.replicas import check_distinct_outboxes, check_replica
from consumer_kit.cli.runtime import friendly_errors, require, writable_folder
from consumer_kit.core.clock import duration_text, parse_duration, utcnow
from consumer_kit.core.db import check_tables, make_engine
from consumer_kit.core.db_errors import describe
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import outbox_table, processed_table, receipt_table
from consumer_kit.core.sqlite_files import check_sqlite_path
from consumer_kit.core.urls import mask_url
from consumer_kit.reconcile import (
    GroupSource,
    ReconcileConfig,
    ReconcileSummary,
    RepairClass,
    Thresholds,
    run_reconcile,
)
from consumer_kit.reconcile.model import (
    DEDUPE_HORIZON,
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENGINE,
    DEFAULT_MASTER,
    DEFAULT_ORPHAN_WINDOW,
    DEFAULT_STUCK_AFTER,
    ENGINES,
)

DEFAULT_OUTPUT = "ckit-out/reconcile"


def reconcile(
    ctx: typer.Context,
    url: list[str] = options.urls("SQLAlchemy URL of the producer database; repeat it for every "
                                  "shard of a sharded outbox (one run, one Spark job) (env "
                                  "CKIT_DB_URL, space separated)"),
    read_url: list[str] = options.read_urls(),
    group: list[str] = typer.Option(
        [], "--group", "-g", metavar="NAME[:TOPIC,...][@TABLE]=DB_URL",
        help="a consumer group, its database and processed table (repeatable); topics limit "
             "what it must consume"),
    processed_table: str = options.processed_table(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    stuck_after: str = typer.Option(duration_text(DEFAULT_STUCK_AFTER), "--stuck-after",
                                    help="SENT (or leased) longer than this is stuck"),
    dedupe_horizon: str = typer.Option(
        duration_text(DEDUPE_HORIZON), "--dedupe-horizon",
        help="a stuck message made longer ago than this is reported, never re-sent (its "
             "processed rows may be purged): keep it under the consumers' processed-row "
             "retention (ckit processed purge --older-than, 7d at least) less a day"),
    max_retries: int | None = typer.Option(
        None, "--max-retries", min=0,
        help="override every row's max_retries (re-sends allowed)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="classify and report, write nothing"),
    output: str = typer.Option(DEFAULT_OUTPUT, "--output", "-o",
                               help="folder for summary.json and samples ('' for none)"),
    engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help=f"one of {', '.join(ENGINES)}"),
    master: str | None = typer.Option(
        None, "--master", help=f"Spark master (default {DEFAULT_MASTER}; spark-submit's own)"),
    conf: list[str] = typer.Option([], "--conf", metavar="KEY=VALUE",
                                   help="Spark configuration (repeatable)"),
    orphan_window: str = typer.Option(
        duration_text(DEFAULT_ORPHAN_WINDOW), "--orphan-window",
        help="processed rows this far before the cutoff are checked for orphans (0 disables)"),
    src: str | None = typer.Option(None, "--src",
                                   help="only processed rows from this producer (ckit_src)"),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, "--batch-size", min=1,
                                   help="rows per repair statement"),
    fail_on_stuck: int | None = typer.Option(
        None, "--fail-on-stuck", metavar="N", min=0,
        help="alert when more than N rows are stuck"),
    fail_on_orphans: int | None = typer.Option(
        None, "--fail-on-orphans", metavar="N", min=0, help="alert when more than N orphans"),
    fail_on_conflicts: int | None = typer.Option(
        None, "--fail-on-conflicts", metavar="N", min=0,
        help="alert when more than N conflicts"),
    fail_on_failures: bool = typer.Option(
        True, "--fail-on-failures/--no-fail-on-failures",
        help="alert when rejected, exhausted or unmatched rows are found"),
    json_out: bool = options.json_output(),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines on stderr"),
    force: bool = typer.Option(
        False, "--force", help="run although a --group has no processed row while its topics "
                               "were consumed, or lists a topic no outbox row holds, or a group "
                               "whose receipts name a stuck topic is not given"),
) -> None:
    """Compare the outbox with every group's processed table and repair stuck rows.

    Several --url reconcile the shards of a sharded outbox in one run; --read-url reads each
    from its replica (in the same order) while every repair goes to its primary. Every option
    is checked before anything is read or repaired (one line, exit 2), and so is what the
    data says of them: a group that processed nothing while its topics are stuck, a topic
    no outbox row holds, a replica lacking rows made --stuck-after ago (`reconcile_checks`).
    """
    spark_submit = bool(ctx.obj and ctx.obj.get("spark_submit"))
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: use one of {', '.join(ENGINES)}")
    if engine == "spark":
        from spark.session import check_master

        check_master(master)
    spark_conf = tuple(_pair(c) for c in conf)
    output_dir = writable_folder(output, option="--output") if output else None
    config = ReconcileConfig(
        producer_url=require(url[0] if url else None, "--url", "CKIT_DB_URL"),
        shards=tuple(url[1:]),
        read_urls=tuple(read_url),
        groups=tuple(GroupSource.parse(g, table=processed_table) for g in group),
        outbox_table=outbox_table,
        receipt_table=receipt_table,
        stuck_after=parse_duration(stuck_after, option="--stuck-after"),
        dedupe_horizon=parse_duration(dedupe_horizon, option="--dedupe-horizon"),
        max_retries=max_retries,
        dry_run=dry_run,
        output_dir=output_dir,
        engine=engine,
        master=master or (None if spark_submit else DEFAULT_MASTER),
        thresholds=Thresholds(stuck=fail_on_stuck, orphans=fail_on_orphans,
                              conflicts=fail_on_conflicts, fail_on_failures=fail_on_failures),
        orphan_window=parse_duration(orphan_window or "0", option="--orphan-window"),
        src=src,
        batch_size=batch_size,
        spark_conf=spark_conf,
    )
    check_databases(config, force=force)
    started = time.monotonic()

    def progress(message: str) -> None:
        if not quiet:
            typer.echo(f"[reconcile {time.monotonic() - started:6.1f}s] {message}", err=True)

    summary = run_reconcile(config, progress=progress)
    if json_out:
        print_json(summary.to_dict())
    else:
        print_summary(summary)
    raise typer.Exit(summary.exit_code)


def print_summary(summary: ReconcileSummary) -> None:
    """The terminal report: counts per class, then cutoff, reads, durations and alerts."""
    mode = " (dry run: nothing written)" if summary.dry_run else ""
    typer.echo(f"reconcile [{summary.engine}]{mode}  now {summary.now.isoformat(sep=' ')}  "
               f"cutoff {summary.cutoff.isoformat(sep=' ')}")
    typer.echo(f"producer {summary.producer}; groups "
               + ", ".join(f"{g['name']} ({g['url']})" for g in summary.groups))
    rows: list[list[Any]] = []
    for klass, count in summary.classes.items():
        repair = "report only" if not klass.repairs else (
            "would repair" if summary.dry_run else "repaired")
        rows.append([klass.value, count.found, count.intended, count.applied, count.conflicts,
                     repair])
    print_table(["class", "found", "intended", "applied", "conflicts", "action"], rows)
    typer.echo(f"window rows {summary.window_rows}; acks inserted {summary.receipts_inserted}; "
               f"statements {summary.statements}; rows read {summary.total_rows_read} "
               f"({', '.join(f'{k}={v}' for k, v in sorted(summary.rows_read.items()))})")
    typer.echo("durations " + ", ".join(f"{k} {v:.2f}s" for k, v in summary.durations.items()))
    if summary.output_dir:
        typer.echo(f"output {summary.output_dir}")
    for alert in summary.alerts:
        typer.echo(f"ALERT: {alert}", err=True)
    if summary.classes[RepairClass.ORPHAN].found:
        typer.echo("orphans are reported only: see samples/orphan.jsonl")


def check_databases(config: ReconcileConfig, *, force: bool = False) -> None:
    """Check every database before the run reads or repairs anything: each URL (driver
    installed, SQLite file there), then each database's tables (the outbox and its receipts on
    every producer database and replica, the processed table of every group), then what their
    rows say of the options (`reconcile_checks.check_clock`: this host's clock against each
    producer database's; `replicas.check_distinct_outboxes`: one producer database named
    twice; `reconcile_checks`: the group and topic checks and a group left out, skipped with
    `force`). A run that repaired the first shard and then met a typo in the second would
    leave half its work done and report none of it.

    Raises:
        ConfigError: the first URL that cannot work (a driver missing, a server that does not
            answer or refuses the login), naming its option; this host's clock too far from a
            producer database's; a producer database, group, topic or replica its rows show
            wrong (`reconcile_checks`).
        SchemaError: a table missing, naming its database.
    """
    metadata = sa.MetaData()
    outbox = outbox_table(metadata, config.outbox_table)
    receipts = receipt_table(metadata, config.receipt_table)
    producers = [config.producer_url, *config.shards]
    checks: list[tuple[str, str, tuple[sa.Table, ...]]] = [
        *(("--url", u, (outbox, receipts)) for u in producers),
        *(("--read-url", u, (outbox,)) for u in config.read_urls),
        *((f"--group {g.name}", g.url, (processed_table(sa.MetaData(), g.table),))
          for g in config.groups),
    ]
    engines: dict[str, sa.engine.Engine] = {}
    now = config.now or utcnow()
    try:
        for option, url, _ in checks:
            try:
                if url not in engines:
                    engines[url] = make_engine(url)
                if engines[url].dialect.name == "sqlite":
                    check_sqlite_path(engines[url].url.database, engines[url].url.query,
                                      must_exist=True)
            except ConfigError as exc:
                raise ConfigError(f"{option}: {exc}") from None
        for option, url, tables in checks:
            try:
                check_tables(engines[url], *tables)
            except sa.exc.OperationalError as exc:  # unreachable, refused, unknown database
                raise ConfigError(f"{option}: {mask_url(url)}: cannot be used: "
                                  f"{describe(exc)}") from None
        for producer in config.producers:
            check_clock(engines[producer.url], producer.url,
                        "--url" if len(producers) == 1 else f"--url number {producer.index + 1}",
                        stuck_after=config.stuck_after)
            if producer.read_url and producer.read_url != producer.url:
                check_replica(engines[producer.url], engines[producer.read_url], outbox,
                              producer.index)
                check_lag(engines[producer.url], engines[producer.read_url], outbox,
                          producer.index, now=now, stuck_after=config.stuck_after)
        check_distinct_outboxes([engines[url] for url in producers], outbox,
                                harm="every stuck row would be repaired, and counted, twice")
        if not force:
            check_groups(config.groups, engines, producers, outbox, receipts,
                         cutoff=now - config.stuck_after, now=now)
            check_left_out(config.groups, engines, producers, outbox, receipts,
                           cutoff=now - config.stuck_after, now=now)
    finally:
        for made in engines.values():
            made.dispose()


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--conf must be KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def register(app: typer.Typer) -> None:
    """Add `ckit reconcile` to the CLI."""
    app.command("reconcile")(friendly_errors(reconcile))


def standalone(argv: list[str]) -> int:
    """Run the reconcile command alone (the spark-submit entry): Spark's master comes from
    spark-submit unless `--master` is given. Returns the exit code (2 for a bad option)."""
    from consumer_kit.cli.runtime import OneLineCommand, configure_logging

    configure_logging(0)
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(cls=OneLineCommand)(friendly_errors(reconcile))
    # Standalone mode lets click print a bad option as one `Error:` line and exit 2 (catching
    # `click.ClickException` here would miss typer versions that vendor their own click).
    try:
        app(args=argv, obj={"spark_submit": True}, standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
