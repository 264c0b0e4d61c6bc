"""`ckit outbox`: look at and repair the producer's outbox (stats, show, retry, suspend, resume,
archive). The operations themselves live in `outbox_producer.ops`; this module parses and prints.

Exit codes: 0 done (a bulk `--state` that matched no row says so in a line); 1 some requested
rows were refused (wrong state, conflict, not found) or `show` found none; 2 a usage or
configuration error (one `error:` line, never a traceback), a `--topic` no row carries among
them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
import typer
from sqlalchemy.engine import Engine

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json, print_table
from consumer_kit.cli.partitions import partitions_app
from consumer_kit.cli.receipts import expected_groups
from consumer_kit.cli.runtime import existing_database, fail, friendly_errors
from consumer_kit.cli.topics import topics_held, unknown_topics
from consumer_kit.core.clock import parse_duration
from consumer_kit.core.schema import DEFAULT_RECEIPT_TABLE, TableNames
from consumer_kit.core.states import OutboxState
from outbox_producer import ops

log = logging.getLogger(__name__)

outbox_app = typer.Typer(
    help="Inspect and repair the outbox. Exit 1 when a requested row was refused, 2 on bad usage.",
    no_args_is_help=True,
)

TARGETS_HELP = "id:N, msg:MESSAGE_ID, biz:KEY, or a bare value when it names one row one way"


def _tables(outbox_table: str, receipt_table: str = DEFAULT_RECEIPT_TABLE
            ) -> ops.OutboxTables:
    return ops.OutboxTables.from_names(TableNames(outbox=outbox_table, receipts=receipt_table))


def _outbox(outbox_table: str) -> sa.Table:
    return _tables(outbox_table).outbox


def _engine(url: str | None) -> Engine:
    return existing_database(url)


def _targets(values: Sequence[str]) -> list[int | str]:
    """Arguments as given: `outbox_producer.ops.resolve` reads `id:N`, `msg:ID`, `biz:KEY` or a
    bare value the same way for every command."""
    return list(values)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


@outbox_app.command("stats")
@friendly_errors
def stats_cmd(
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    lag_window: str = typer.Option("1h", "--lag-window", help="lag over rows sent this recently"),
    as_json: bool = options.json_output(),
) -> None:
    """Counts per state, oldest PENDING and SENT ages, sent-to-consumed lag p50/p95/max."""
    result = ops.stats(_engine(url), _outbox(outbox_table),
                       lag_window=parse_duration(lag_window, option="--lag-window"))
    if as_json:
        print_json(result.to_dict())
        return
    print_table(["state", "code", "rows"],
                [(name, _code(name), count) for name, count in result.counts.items()])
    typer.echo(f"total: {result.total}")
    typer.echo(f"oldest PENDING: {_age(result.oldest_pending_age_s)}   "
               f"oldest SENT: {_age(result.oldest_sent_age_s)}")
    lag = result.lag
    window = f"last {result.lag_window_s:g}s"
    if lag is None:
        typer.echo(f"sent->consumed lag ({window}): no consumed rows")
    else:
        typer.echo(f"sent->consumed lag ({window}, {lag.samples} rows): "
                   f"p50 {lag.p50:.3f}s  p95 {lag.p95:.3f}s  max {lag.max:.3f}s")


def _code(name: str) -> str:
    return str(OutboxState[name].value) if name in OutboxState.__members__ else "?"


SHOW_FIELDS = ("id", "message_id", "biz_type", "biz_key", "topic", "tags", "keys", "state",
               "retry_count", "max_retries", "next_retry_at", "last_attempt_at", "fail_reason",
               "broker_message_id", "sent_at", "consumed_at", "lease_owner", "lease_until",
               "lock_version", "created_by", "updated_by", "gmt_create", "gmt_modified")
BODY_PREVIEW = 200


def _not_found(ident: str) -> str:
    """The line for a `show` target no row matches, naming the way it was looked up."""
    way, _, value = ident.partition(":")
    if way == "id":
        return f"no outbox row with id {value}"
    if way == "msg":
        return f"no message with message_id {value!r}"
    if way == "biz":
        return f"no message with biz key {value!r}"
    return f"no message with message_id or biz_key {ident!r}"


@outbox_app.command("show")
@friendly_errors
def show_cmd(
    ident: str = typer.Argument(..., metavar="id:N|msg:MESSAGE_ID|biz:KEY"),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    as_json: bool = options.json_output(),
) -> None:
    """One message, or every message with a biz key, with its receipt rows: id:N, msg:MESSAGE_ID,
    biz:KEY (any biz type) or biz:TYPE:KEY; a bare value is taken when it matches one way
    only."""
    views = ops.show(_engine(url), _tables(outbox_table, receipt_table), ident)
    if not views:
        fail(_not_found(ident), code=1)
    if as_json:
        print_json([v.to_dict() for v in views])
        return
    for number, view in enumerate(views):
        data = view.to_dict()
        message = data["message"]
        if number:
            typer.echo("")
        width = max(len(f) for f in SHOW_FIELDS)
        for field in SHOW_FIELDS:
            value = message.get(field)
            if field == "state":
                value = f"{value} ({view.state.value})"
            typer.echo(f"{field.ljust(width)}  {'' if value is None else value}")
        body = str(message.get("body", ""))
        more = f" ... ({len(body)} chars)" if len(body) > BODY_PREVIEW else ""
        problem = f"  ({message['headers_problem']})" if "headers_problem" in message else ""
        typer.echo(f"{'headers'.ljust(width)}  {message.get('headers')}{problem}")
        typer.echo(f"{'body'.ljust(width)}  {body[:BODY_PREVIEW]}{more}")
        typer.echo("receipts:" if view.receipts else "receipts: none")
        if view.receipts:
            print_table(["consumer_group", "outcome", "received_at", "reason"],
                        [(a["consumer_group"], a["outcome"], a["received_at"], a["reason"])
                         for a in view.receipts])


def _report(result: ops.TransitionResult, as_json: bool, left: str | None = None,
            more: bool | None = None) -> None:
    """Print `result`; for a bulk form, `more` says whether its `--limit` left rows behind,
    and `left` what they are ("FAILED rows are left" after the line naming the limit)."""
    if as_json:
        print_json(result.to_dict() | ({} if more is None else {"more": more}))
    else:
        typer.echo(f"{result.action}: {len(result.changed)} changed, "
                   f"{len(result.refused)} refused")
        if more and left:
            typer.echo(f"{left}, run it again for the rest")
        if result.refused:
            print_table(["target", "state", "reason"],
                        [(r.target, r.state or "-", r.reason) for r in result.refused])
    if result.refused:
        raise typer.Exit(1)


@outbox_app.command("retry")
@friendly_errors
def retry_cmd(
    targets: list[str] = typer.Argument(None, metavar="[ID...]", help=TARGETS_HELP),
    state: str | None = typer.Option(None, "--state", help="bulk: rows in this state (name/code)"),
    topic: str | None = typer.Option(None, "--topic", help="bulk: only this topic"),
    limit: int = typer.Option(ops.DEFAULT_BULK_LIMIT, "--limit", min=1,
                              help="bulk: at most N rows"),
    force: bool = typer.Option(False, "--force", help="also re-send SENT and CONSUMED rows"),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    as_json: bool = options.json_output(),
) -> None:
    """Re-queue FAILED/SUSPENDED/REJECTED rows as PENDING with retry_count 0, due now.

    Give ids, or --state (with --topic/--limit) for a bulk retry. SENT and CONSUMED rows need
    --force. The rows' receipt rows are deleted: the receipts of the re-send decide.
    fail_reason is kept, prefixed `operator retry (was STATE):`.
    """
    if targets and state is not None:
        fail("give ids or --state, not both")
    if not targets and state is None:
        fail("give the ids to retry, or --state STATE [--topic T] [--limit N]")
    if topic is not None and state is None:
        fail("--topic needs --state")
    engine = _engine(url)
    tables = _tables(outbox_table, receipt_table)
    if state is None:
        _report(ops.retry(engine, tables, _targets(targets), force=force), as_json)
        return
    wanted = OutboxState.parse(state)
    states = ops.retry_states([wanted], force=force)  # refuse SENT/CONSUMED before selecting
    # one more than --limit: whether rows are left for another run (else said of none)
    found = ops.select_ids(engine, tables.outbox, states=states, topic=topic, limit=limit + 1)
    ids: list[int | str] = list(found[:limit])
    if not ids:
        if topic is not None and unknown_topics(engine, tables.outbox, [topic]):
            fail(f"no outbox row has topic {topic!r}, nor an archived one, while the outbox "
                 "holds rows of other topics: a misspelt --topic?")
        typer.echo(f"no {wanted.name} rows" + (f" for topic {topic}" if topic else ""))
        return
    _report(ops.retry(engine, tables, ids, states=states, force=force), as_json,
            left=f"stopped at --limit {limit}: {wanted.name} rows "
                 + (f"of topic {topic} " if topic else "") + "are left",
            more=len(found) > limit)


def _move(
    move: Callable[[Engine, sa.Table, list[int | str]], ops.TransitionResult],
    targets: list[str], url: str | None, table: str, as_json: bool,
) -> None:
    """The body of `suspend` and `resume`: one operator move on the given rows, reported."""
    _report(move(_engine(url), _outbox(table), _targets(targets)), as_json)


@outbox_app.command("suspend")
@friendly_errors
def suspend_cmd(
    targets: list[str] = typer.Argument(..., metavar="ID...", help=TARGETS_HELP),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    as_json: bool = options.json_output(),
) -> None:
    """Hold PENDING, FAILED (and SENDING rows whose lease expired) in SUSPENDED."""
    _move(ops.suspend, targets, url, outbox_table, as_json)


@outbox_app.command("resume")
@friendly_errors
def resume_cmd(
    targets: list[str] = typer.Argument(..., metavar="ID...", help=TARGETS_HELP),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    as_json: bool = options.json_output(),
) -> None:
    """Put SUSPENDED rows back to PENDING, due now."""
    _move(ops.resume, targets, url, outbox_table, as_json)


@outbox_app.command("archive")
@friendly_errors
def archive_cmd(
    older_than: str = typer.Option("30d", "--older-than", help="age of the last change, e.g. 30d"),
    batch: int = typer.Option(ops.DEFAULT_ARCHIVE_BATCH, "--batch", min=1,
                              help="rows per transaction"),
    max_batches: int = typer.Option(ops.DEFAULT_ARCHIVE_MAX_BATCHES, "--max-batches", min=1,
                                    help="stop after N batches (run again for the rest)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="count the rows, move nothing"),
    pause: str = typer.Option("0", "--pause", help="wait between batches (e.g. 50ms) so a hot "
                              "outbox, its purge and its replicas keep up"),
    expect: list[str] = typer.Option(
        [], "--expect", metavar="TOPIC=g1,g2",
        help="receipt-driven: move CONSUMED rows of TOPIC once every group's consumed receipt "
             "is stored (repeatable; --older-than is then a grace period)"),
    url: str | None = options.url(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    force: bool = typer.Option(False, "--force", help="allow --older-than under the safety "
                               f"floor of {ops.ARCHIVE_FLOOR.days} days"),
    as_json: bool = options.json_output(),
) -> None:
    """Move CONSUMED and REJECTED rows last changed before the horizon into <table>_archive.

    Small batches in primary-key order, one transaction each, --pause between them; one run
    per table at a time (a second run exits 2). With --expect only rows every expected group
    acknowledged move. publish is idempotent on (biz_type, biz_key) only while the first row
    is in the outbox table: a horizon under the safety floor (7 days) is refused unless
    --force.
    """
    horizon = parse_duration(older_than, option="--older-than")
    ops.check_archive_floor(horizon, option=older_than, force=force or dry_run, verb="archive")
    wait = parse_duration(pause, option="--pause").total_seconds()
    engine = _engine(url)
    tables = _tables(outbox_table, receipt_table)
    expected = expected_groups(expect) if expect else None
    if expected and sa.inspect(engine).has_table(tables.outbox.name):  # else archive says so
        _warn_of_unknown_topics(engine, tables.outbox, expected)
    result = ops.archive(engine, tables, horizon, batch=batch, max_batches=max_batches,
                         dry_run=dry_run, pause=wait, expect=expected)
    if as_json:
        data: dict[str, Any] = result.to_dict()
        data["archive_table"] = tables.archive.name
        print_json(data)
        return
    if dry_run:
        typer.echo(f"{result.moved} rows older than {result.cutoff} would move to "
                   f"{tables.archive.name}")
        return
    typer.echo(f"archived {result.moved} rows in {result.batches} batches into "
               f"{tables.archive.name} (cutoff {result.cutoff})")
    if result.more:
        typer.echo(f"stopped after --max-batches {max_batches}: run again for the rest")


def _warn_of_unknown_topics(engine: Engine, outbox: sa.Table, expected: dict[str, list[str]]
                            ) -> None:
    """Say so when an `--expect` topic is one no row of the outbox nor of its archive carries
    (`topics.unknown_topics`): a misspelt topic in a cron line archives none of the rows
    meant, run after run, and the outbox grows. A warning, not a refusal: it moves nothing."""
    for topic in unknown_topics(engine, outbox, expected):
        log.warning("--expect %s: no outbox row has topic %r, nor an archived one (topics "
                    "there: %s): a misspelt topic archives none of the rows meant",
                    topic, topic, topics_held(engine, outbox))


def register(app: typer.Typer) -> None:
    """Add the `outbox` sub-command group (with `outbox partitions`) to the `ckit` app."""
    outbox_app.add_typer(partitions_app, name="partitions")
    app.add_typer(outbox_app, name="outbox")
