"""`ckit acks`: consume the producer's ack topic and apply the acks to its outbox."""

from __future__ import annotations

import threading

import typer

from consumer_kit.cli.common import (
    db_url_option,
    friendly_errors,
    print_totals,
    require,
    transport_option,
)
from consumer_kit.cli.signals import on_shutdown
from consumer_kit.db import check_tables, make_engine
from consumer_kit.runner import run_consumer
from consumer_kit.schema import DEFAULT_ACK_TABLE, DEFAULT_OUTBOX_TABLE
from consumer_kit.transports import open_transport


def _expected(pairs: list[str]) -> dict[str, list[str]]:
    expected: dict[str, list[str]] = {}
    for pair in pairs:
        topic, sep, groups = pair.partition("=")
        if not sep or not topic or not groups:
            raise ValueError(f"invalid --expect {pair!r}: use TOPIC=group1,group2")
        expected[topic] = [g for g in groups.split(",") if g]
    return expected


@friendly_errors
def acks(
    url: str | None = db_url_option("SQLAlchemy URL of the producer database (env CKIT_DB_URL)"),
    transport: str | None = transport_option(),
    producer: str = typer.Option(..., "--producer", envvar="CKIT_PRODUCER",
                                 help="producer service name (its ack topic is ckit-ack-NAME)"),
    expect: list[str] = typer.Option([], "--expect",
                                     help="TOPIC=g1,g2: groups that must all ack (repeatable)"),
    burst: bool = typer.Option(False, "--burst", help="drain what is there, then exit"),
    table: str = typer.Option(DEFAULT_OUTBOX_TABLE, "--table", help="outbox table"),
    ack_table: str = typer.Option(DEFAULT_ACK_TABLE, "--ack-table", help="ack table"),
    as_json: bool = typer.Option(False, "--json", help="print the totals as JSON"),
) -> None:
    """Apply acks from the ack topic: CONSUMED when every expected group acked, REJECTED when
    a group rejected."""
    from outbox_producer.ack_consumer import AckConsumer
    from outbox_producer.acks import AckApplier

    db = make_engine(require(url, "--url", "CKIT_DB_URL"))
    applier = AckApplier(db, table=table, ack_table_name=ack_table,
                         expected_groups=_expected(expect))
    check_tables(db, applier.table, applier.acks)
    target = open_transport(require(transport, "--transport", "CKIT_TRANSPORT"))
    worker = AckConsumer(applier, target, producer=producer)
    stop = threading.Event()
    on_shutdown(stop.set)
    try:
        run_consumer(worker.consumer(), stop, burst=burst, activity=worker.activity)
    finally:
        target.close()
    totals = {"acks": worker.totals.received, "recorded": worker.totals.recorded,
              "consumed": worker.totals.consumed, "rejected": worker.totals.rejected,
              "unknown": worker.totals.unknown, "malformed": worker.malformed}
    print_totals(totals, as_json)


def register(app: typer.Typer) -> None:
    """Add `acks` to the CLI."""
    app.command("acks")(acks)
