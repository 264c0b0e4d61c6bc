"""`ckit relay`: send what is due in the outbox of one or several producer databases."""

from __future__ import annotations

import logging
import math
from typing import Any

import typer
from sqlalchemy import exc as sa_exc

from consumer_kit.cli import options
from consumer_kit.cli.output import print_json, print_table, print_totals
from consumer_kit.cli.replicas import check_replica
from consumer_kit.cli.runtime import (
    EXIT_FAILURE,
    existing_database,
    fail,
    fail_if_signalled,
    friendly_errors,
    on_shutdown,
    require,
    serve_metrics,
)
from consumer_kit.cli.transports import open_for_processes
from consumer_kit.core.clock import parse_duration
from consumer_kit.core.db import check_tables
from consumer_kit.core.db_errors import is_transient
from consumer_kit.core.errors import ConfigError
from consumer_kit.transports.base import Consumer, Transport
from outbox_producer.checks import Checker
from outbox_producer.claim import DEFAULT_LEASE, Shard
from outbox_producer.relay import (
    DEFAULT_BATCH,
    DEFAULT_IDLE_SLEEP,
    DEFAULT_ONCE_OUTAGE_LIMIT,
    MIN_RATE,
    RelayResult,
)
from outbox_producer.replica import DEFAULT_SWEEP_EVERY
from outbox_producer.shards import MultiRelay

log = logging.getLogger(__name__)

LEASE_TEXT = f"{DEFAULT_LEASE.total_seconds():g}s"
#: the shortest `--idle-sleep` (seconds)
MIN_IDLE_SLEEP = 0.1


@friendly_errors
def relay(
    url: list[str] = options.urls("SQLAlchemy URL of a producer database; repeat it to serve "
                                  "several (a sharded outbox) from this process (env "
                                  "CKIT_DB_URL, space separated)"),
    read_url: list[str] = options.read_urls(),
    transport: str | None = options.transport(),
    mq_prefix: str = options.mq_prefix(),
    once: bool = typer.Option(False, "--once", help="drain what is due, then exit"),
    batch: int = typer.Option(DEFAULT_BATCH, "--batch", min=1, help="rows claimed per batch"),
    workers: int = typer.Option(1, "--workers", min=1,
                                help="claim/send loops per database (they never overlap)"),
    shard: str | None = typer.Option(None, "--shard", help="i/N: only rows with MOD(id, N) = i"),
    max_rate: float | None = typer.Option(None, "--max-rate",
                                          help="cap on sends per second, per database"),
    lease: str = typer.Option(LEASE_TEXT, "--lease",
                              help="send lease; expired leases are reclaimed"),
    claim: str = typer.Option(
        "lease", "--claim",
        help="lease: claim rows SENDING under --lease, send, mark SENT (two UPDATEs per "
             "message); lock: send rows held locked and mark them in that transaction (one "
             "UPDATE; PostgreSQL or MariaDB >= 10.6; --lease bounds the held transaction)"),
    retry_failed_after: str | None = typer.Option(
        None, "--retry-failed-after", help="slow retry of FAILED rows after this long (e.g. 1h)"),
    give_up_after: str = typer.Option(
        f"{DEFAULT_ONCE_OUTAGE_LIMIT:g}s", "--give-up-after",
        help="with --once: exit 1 when the broker or database stays down this long"),
    idle_sleep: str = typer.Option(
        f"{DEFAULT_IDLE_SLEEP:g}s", "--idle-sleep",
        help="wait between polls when nothing is due (long, e.g. 60s, with --check-topic)"),
    sweep_every: str = typer.Option(
        f"{DEFAULT_SWEEP_EVERY:g}s", "--sweep-every",
        help="with --read-url: claim on the primary this often whatever the replica shows"),
    check_topic: str | None = typer.Option(
        None, "--check-topic", envvar="CKIT_CHECK_TOPIC",
        help="handle the dispatcher's delayed checks from this topic (group ckit-check-<db>)"),
    outbox_table: str = options.outbox_table(),
    as_json: bool = options.json_output(),
    metrics_port: int | None = options.metrics_port(),
) -> None:
    """Claim due outbox rows, send them, mark SENT (or retry with back-off, or FAILED).

    Several --url: one relay per database in this process, each on its own threads. With
    --read-url the scans for due rows run on the replica; every claim is re-checked on the
    primary. With --check-topic the dispatcher's delayed checks re-send what it could not, and
    the polls (--idle-sleep) are only the fallback. A misconfiguration (a missing table, a
    transport that cannot reach other processes, a bad option) fails with one line and exit 2
    before any row moves. With --once, an outage that outlasts --give-up-after ends the run
    with exit 1; nothing is charged a retry for it.
    """
    if max_rate is not None and not (math.isfinite(max_rate) and max_rate >= MIN_RATE):
        raise ConfigError(f"--max-rate must be a number of sends per second, at least one a "
                          f"day ({MIN_RATE:.3g}), not {max_rate}")
    if not url:
        fail("missing --url (or set CKIT_DB_URL)")
    if check_topic and once:
        raise ConfigError("--check-topic needs a running relay, not --once")
    sweep = parse_duration(sweep_every, option="--sweep-every").total_seconds()
    idle = parse_duration(idle_sleep, option="--idle-sleep").total_seconds()
    if idle < MIN_IDLE_SLEEP:
        raise ConfigError(f"--idle-sleep {idle_sleep}: at least {MIN_IDLE_SLEEP:g}s (shorter "
                          "polls the database back to back, a busy loop)")
    failed_after = (parse_duration(retry_failed_after, option="--retry-failed-after")
                    if retry_failed_after else None)
    if failed_after is not None and not once and failed_after.total_seconds() < 1:
        raise ConfigError(f"--retry-failed-after {retry_failed_after}: at least 1s in a running "
                          "relay (a FAILED row the broker refuses would be re-sent back to "
                          "back; with --once each is tried once)")
    relay_options: dict[str, Any] = dict(
        table=outbox_table, batch=batch, workers=workers, max_rate=max_rate,
        shard=Shard.parse(shard) if shard is not None else None,
        lease=parse_duration(lease, option="--lease"), failed_retry_after=failed_after,
        once_outage_limit=parse_duration(give_up_after, option="--give-up-after").total_seconds(),
        idle_sleep=idle, sweep_every=sweep, claim=claim)
    target = open_for_processes(
        require(transport, "--transport", "CKIT_TRANSPORT"), command="ckit relay",
        outage_limit=relay_options["once_outage_limit"] if once else None, mq_prefix=mq_prefix)
    consumers: list[Consumer] = []
    try:
        for text in url:  # a SQLite file that is not there: building a relay would make it
            existing_database(text).dispose()
        relays = MultiRelay(url, target, read_urls=read_url, **relay_options)
        for index, worker in enumerate(relays.relays):
            check_tables(worker.engine, worker.table)
            if worker.read_engine is not None:
                try:
                    check_replica(worker.engine, worker.read_engine, worker.table, index)
                except sa_exc.DBAPIError as exc:
                    # unreachable is an outage, which the relay rides out on the primary (a
                    # relay must start while its replica is down); a wrong one (a password,
                    # a user's grants) is refused
                    if not is_transient(exc, worker.read_engine.dialect.name):
                        raise
                    log.warning("--read-url number %d does not answer (%s): scanning the "
                                "primary until it does", index + 1, exc.orig or exc)
        relays.check()  # one outbox given twice (every row sent twice): refused
        target.check()
        if check_topic:
            consumers = _checkers(relays, target, check_topic)
        on_shutdown(relays.stop)
        serve_metrics(metrics_port)  # after the handlers: a scrape means SIGTERM is safe
        for consumer in consumers:
            consumer.start()
        result = relays.run(once=once)
    finally:
        for consumer in consumers:
            consumer.shutdown()
        target.close()
    _report(relays, result, as_json)
    if result.gave_up:
        typer.echo(f"error: gave up after --give-up-after {give_up_after}: {result.gave_up}",
                   err=True)
        raise typer.Exit(EXIT_FAILURE)
    if once:  # a running relay stopped by a signal did its job; a --once one may not have
        fail_if_signalled("--once", "what was due: what it sent stays sent, the rows still "
                          "due wait for the next run")


def _checkers(relays: MultiRelay, transport: Transport, topic: str) -> list[Consumer]:
    """A delayed-check consumer per database (their keys must differ)."""
    checkers = [Checker(w.engine, w.table, transport, topic=topic, lease=w.claimer.lease,
                        backoff=w.sender.backoff) for w in relays.relays]
    keys = [c.key for c in checkers]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--check-topic needs databases with distinct names, got {keys}")
    transport.ensure_topic(topic)
    return [checker.consumer(transport) for checker in checkers]


def _totals(result: RelayResult) -> dict[str, int]:
    return {"batches": result.batches, "sent": result.stats.sent,
            "retried": result.stats.retried, "failed": result.stats.failed,
            "unmarked": result.stats.unmarked,
            "conflicts": result.stats.conflicts, "errors": result.errors}


def _report(relays: MultiRelay, result: RelayResult, as_json: bool) -> None:
    totals = _totals(result)
    if len(relays.relays) == 1:
        print_totals(totals, as_json)
        return
    per_db = [{"database": name, **_totals(part)}
              for name, part in zip(relays.names(), relays.results)]
    if as_json:
        print_json({**totals, "databases": per_db})
        return
    rows = [list(row.values()) for row in per_db]
    rows.append(["total", *totals.values()])
    print_table(list(per_db[0]), rows)


def register(app: typer.Typer) -> None:
    """Add `relay` to the CLI."""
    app.command("relay")(relay)
