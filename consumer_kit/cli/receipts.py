"""`ckit receipts`: consume the producer's receipt topic and apply the receipts to its outbox."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import typer

from consumer_kit.cli import options
from consumer_kit.cli.output import print_totals
from consumer_kit.cli.replicas import check_distinct_outboxes
from consumer_kit.cli.runtime import (
    existing_database,
    fail_if_signalled,
    friendly_errors,
    on_shutdown,
    require,
    serve_metrics,
)
from consumer_kit.cli.topics import topics_held, unknown_topics
from consumer_kit.cli.transports import open_for_processes
from consumer_kit.core.db import any_row, check_tables
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.receipts_shards import ShardedReceiptApplier
from consumer_kit.transports.running import run_consumer
from outbox_producer.receipts.consumer import ReceiptConsumer
from outbox_producer.validation import check_producer

log = logging.getLogger(__name__)

#: outbox rows `warn_unless_producer_published` reads, the newest by id (the primary key's
#: order, so the read is cheap on any outbox; `created_by` has no index)
RECENT_ROWS = 1000


def warn_unless_producer_published(db: sa.engine.Engine, table: sa.Table, producer: str) -> None:
    """A warning naming the producers that did publish when the outbox's newest `RECENT_ROWS`
    rows hold some and none of them was published by `producer` (a misspelt `--producer`
    consumes a receipt topic nobody writes to, and applies nothing). A warning, not a
    refusal: an outbox shared by several producers may hold none of this one's lately."""
    newest = (sa.select(table.c.created_by).order_by(table.c.id.desc()).limit(RECENT_ROWS)
              .subquery())
    with db.connect() as conn:
        names = {name for (name,) in conn.execute(sa.select(newest.c.created_by).distinct())}
    if names and producer not in names:
        found = ", ".join(sorted(repr(n) for n in names if n is not None)) or "none"
        log.warning("no row of the newest %d in %s was published by --producer %r (producers "
                    "found: %s): its receipts come from topic ckit-receipt-%s, so check the "
                    "name", RECENT_ROWS, table.name, producer, found, producer)


def expected_groups(pairs: list[str]) -> dict[str, list[str]]:
    """`TOPIC=g1,g2` pairs as a mapping (the `--expect` option). A topic given twice gets
    the groups of both (`--expect T=a --expect T=b` is `T=a,b`).

    >>> expected_groups(["T=a", "T=b,a", "U=c"])
    {'T': ['a', 'b'], 'U': ['c']}

    Raises:
        ConfigError: a pair without a topic or groups.
    """
    expected: dict[str, list[str]] = {}
    for pair in pairs:
        topic, sep, groups = pair.partition("=")
        names = [g.strip() for g in groups.split(",") if g.strip()]
        if not sep or not topic.strip() or not names:
            raise ConfigError(f"invalid --expect {pair!r}: use TOPIC=group1,group2")
        groups_of = expected.setdefault(topic.strip(), [])
        groups_of.extend(n for n in names if n not in groups_of)
    return expected


def check_expected_topics(dbs: Sequence[sa.engine.Engine], table: sa.Table,
                          expected: dict[str, list[str]]) -> None:
    """Refuse an `--expect` topic no row of the outbox `table` nor of its archive carries in
    any of the producer databases `dbs` while they hold rows (`topics.unknown_topics`; a
    database without rows has no say): a misspelt topic leaves the one meant without expected
    groups, so its rows turn CONSUMED on any one group's receipt.

    Raises:
        ConfigError: naming the first such topic, the topics there, and --force.
    """
    with_rows = [db for db in dbs if any_row(db, table)]
    unknown_in = [set(unknown_topics(db, table, expected)) for db in with_rows]
    unknown = [t for t in expected if unknown_in and all(t in u for u in unknown_in)]
    if unknown:
        topic, db = unknown[0], with_rows[0]
        raise ConfigError(
            f"--expect {topic}: no outbox row has topic {topic!r}, nor an archived one (topics "
            f"there: {topics_held(db, table)}): a misspelt topic leaves the one meant without "
            f"its groups ({', '.join(expected[topic])}), whose rows then turn CONSUMED on any one "
            f"group's receipt (--force if nothing was published on {topic!r} yet)")


@friendly_errors
def receipts(
    url: list[str] = options.urls("SQLAlchemy URL of the producer database; repeat it for a "
                                  "sharded producer: each receipt goes to the database holding "
                                  "its message (env CKIT_DB_URL, space separated)"),
    transport: str | None = options.transport(),
    mq_prefix: str = options.mq_prefix(),
    producer: str = options.producer(),
    expect: list[str] = typer.Option([], "--expect", help="TOPIC=g1,g2: groups that must all "
                                     "send a consumed receipt (repeatable)"),
    burst: bool = options.burst(),
    outbox_table: str = options.outbox_table(),
    receipt_table: str = options.receipt_table(),
    as_json: bool = options.json_output(),
    metrics_port: int | None = options.metrics_port(),
    force: bool = typer.Option(False, "--force", help="run although an --expect topic is one "
                               "no outbox row holds (nothing was published on it yet)"),
) -> None:
    """Apply receipts from the receipt topic: CONSUMED when every expected group consumed the
    message, REJECTED when a group rejected it. Several --url (a sharded producer, one name):
    each receipt goes to the database that holds its message. A batch is applied before the
    broker is acked, so a kill at any point loses nothing (applying it again changes nothing).

    An --expect topic that no outbox row holds, nor an archived one, while the outbox holds
    rows of others, is refused as misspelt (its rows would turn CONSUMED on any one group's
    receipt) unless --force. Two --url that hold one outbox (one database twice, a copy of a
    shard given as another) are refused."""
    check_producer(producer)  # before anything is made: it names the topic and group
    dbs = [existing_database(text) for text in url] or [existing_database(None)]
    expected = expected_groups(expect)
    appliers = [ReceiptApplier(db, table=outbox_table, receipt_table_name=receipt_table,
                               expected_groups=expected) for db in dbs]
    for part in appliers:
        check_tables(part.engine, part.table, part.receipts)
    applier = ShardedReceiptApplier(appliers)
    check_distinct_outboxes([part.engine for part in appliers], applier.table,
                            harm="each of its receipts would go to the first alone, the "
                                 "other's rows left SENT")
    if not force:
        check_expected_topics(dbs, applier.table, expected)
    target = open_for_processes(require(transport, "--transport", "CKIT_TRANSPORT"),
                                command="ckit receipts", mq_prefix=mq_prefix)
    worker = ReceiptConsumer(applier, target, producer=producer)
    stop = threading.Event()
    try:
        target.check()
        for db in dbs:
            warn_unless_producer_published(db, applier.table, producer)
        serve_metrics(metrics_port)
        on_shutdown(stop.set)
        run_consumer(worker.consumer(), stop, burst=burst, activity=worker.activity)
    finally:
        target.close()
    totals = {"receipts": worker.totals.received, "recorded": worker.totals.recorded,
              "consumed": worker.totals.consumed, "rejected": worker.totals.rejected,
              "unknown": worker.totals.unknown, "malformed": worker.malformed}
    print_totals(totals, as_json)
    if burst:
        fail_if_signalled("--burst", "the receipt topic: what it applied stays applied, the "
                          "rest waits on the topic")


@functools.wraps(receipts)
def acks(*args: Any, **kwargs: Any) -> None:
    """`ckit acks`, 0.1.0's command: `receipts`, saying that the topic it reads changed (a
    supervisor still running it after an upgrade would leave 0.1.0's topic unread silently)."""
    producer = kwargs.get("producer", "")
    log.warning("ckit acks is the old name of ckit receipts: it reads ckit-receipt-%s, not "
                "0.1.0's ckit-ack-%s (acks left there are never applied: README, Upgrading)",
                producer, producer)
    receipts(*args, **kwargs)


def register(app: typer.Typer) -> None:
    """Add `receipts` (and its old name `acks`, hidden) to the CLI."""
    app.command("receipts")(receipts)
    app.command("acks", hidden=True, help="old name of `ckit receipts`")(acks)
