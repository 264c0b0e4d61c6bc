"""`ckit demo`: the whole loop on embedded defaults, with faults injected on purpose.

An order service publishes through the outbox; the relay sends over the SQL transport (SQLite
files, no server); some messages are sent twice (producer retries); the inventory consumer
dedupes (database only, or Redis when given); one receipt is lost on purpose; `ckit receipts`
applies the rest; the reconciler repairs the row the lost receipt left in SENT. The summary
checks the result.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.cli.demo_facts import DEMO_FILES, DUPLICATES
from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import retry_topic
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.outcome import Outcome
from consumer_kit.receipts import ReceiptRoute, TopicRoute
from consumer_kit.transports.running import run_consumer
from consumer_kit.transports.sql import SqlTransport

DEFAULT_ORDERS = 20
GROUP = "inventory"
#: the consumer's whole run, redeliveries included
CONSUME_SECONDS = 120.0


class LossyRoute(ReceiptRoute):
    """The topic receipt route, except that the receipts of `lose` vanish (an injected fault)."""

    name = "topic"

    def __init__(self, inner: TopicRoute, lose: set[str]) -> None:
        self.inner = inner
        self.lose = lose
        self.lost: list[str] = []

    def deliver(self, producer: str, receipts: list[Receipt]) -> None:
        kept = [r for r in receipts if r.message_id not in self.lose]
        self.lost += [r.message_id for r in receipts if r not in kept]
        if kept:
            self.inner.deliver(producer, kept)


@dataclasses.dataclass
class DemoResult:
    """What the demo counted, and whether every invariant held."""

    rows: list[tuple[str, object, str]]
    ok: bool
    workdir: Path


def _step(say: Callable[[str], None], text: str) -> None:
    say(f"-> {text}")


def run_demo(
    *,
    orders: int = DEFAULT_ORDERS,
    workdir: Path | None = None,
    redis_url: str | None = None,
    engine: str = "auto",
    say: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo in `workdir` (a fresh temporary folder by default, removed afterwards,
    also when a step fails) and return its summary. The options are checked by `ckit demo`
    before this runs."""
    keep = workdir is not None
    root = Path(workdir or tempfile.mkdtemp(prefix="ckit-demo-"))
    try:
        return _run(root, orders=orders, redis_url=redis_url, engine=engine, say=say)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, *, orders: int, redis_url: str | None, engine: str,
         say: Callable[[str], None]) -> DemoResult:
    from consumer_kit.core.envelope import to_message
    from consumer_kit.core.rows import OutboxRow
    from consumer_kit.reconcile import GroupSource, ReconcileConfig, run_reconcile
    from examples import inventory
    from examples import orders as order_service
    from outbox_producer import Outbox, ReceiptApplier, Relay
    from outbox_producer.receipts.consumer import ReceiptConsumer

    root.mkdir(parents=True, exist_ok=True)
    orders_file, inventory_file, mq_file = DEMO_FILES
    orders_url = f"sqlite:///{root / orders_file}"
    inventory_url = f"sqlite:///{root / inventory_file}"
    orders_db, inventory_db = make_engine(orders_url), make_engine(inventory_url)
    order_service.setup(orders_db)
    inventory.setup(inventory_db)
    transport = SqlTransport(f"sqlite:///{root / mq_file}", create_tables=True,
                             retry_delays=(0.2,))
    say(f"demo folder: {root}  (orders.db, inventory.db, mq.db: SQLite, no server)")

    _step(say, f"order service: {orders} orders, each written with its message in one "
          "transaction (one has an unknown SKU)")
    outbox = Outbox(orders_db, producer=order_service.PRODUCER)
    for order_id in range(1, orders + 1):
        sku = "SKU-X" if order_id == orders else f"SKU-{order_id % 3}"
        with Session(orders_db) as session, session.begin():
            order_service.place_order(session, outbox, order_id, sku, 1)
    with Session(orders_db) as session, session.begin():  # the same business event again
        again = outbox.publish(session, order_service.TOPIC, {"order_id": 1},
                               biz_type="order", biz_key="1")
    _step(say, "relay: send everything due")
    relayed = Relay(orders_db, transport).run_once().stats.sent

    table = outbox_table(sa.MetaData())
    with orders_db.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    _step(say, f"inject: {DUPLICATES} messages sent a second time (a producer retry)")
    for row in rows[:DUPLICATES]:
        transport.send(to_message(OutboxRow.from_mapping(row)))
    lose = {rows[DUPLICATES]["message_id"]}

    _step(say, "inventory consumer: dedupe, reserve stock, send receipts (one lost on purpose)")
    route = LossyRoute(TopicRoute(transport), lose)
    app = inventory.make_app(db=inventory_db, transport=transport, redis=redis_url, receipts=route)
    # a burst run also waits for redeliveries still scheduled (with Redis, a duplicate that
    # finds the first copy's lease held is answered BUSY and comes back as a duplicate)
    app.run(burst=True, max_seconds=CONSUME_SECONDS)
    app.close()
    counts = app.pipeline().counts

    _step(say, "ckit receipts: apply the receipts that arrived")
    applier = ReceiptApplier(orders_db)
    acks = ReceiptConsumer(applier, transport, producer=order_service.PRODUCER)
    run_consumer(acks.consumer(), threading.Event(), burst=True, max_seconds=60)
    consumed_before = _count_state(orders_db, table, OutboxState.CONSUMED)

    chosen = _engine(engine)
    _step(say, f"reconcile ({chosen} engine): find rows stuck in SENT and repair them")
    summary = run_reconcile(ReconcileConfig(
        producer_url=orders_url, groups=(GroupSource("inventory", inventory_url),),
        stuck_after=dt.timedelta(milliseconds=1), engine=chosen, master="local[1]",
    ), progress=lambda _m: None)
    repaired = sum(c.applied for c in summary.classes.values())

    with inventory_db.connect() as conn:
        effects = conn.execute(sa.select(sa.func.count()).select_from(
            inventory.reservations)).scalar() or 0
        distinct = conn.execute(sa.select(sa.func.count(sa.distinct(
            inventory.reservations.c.order_id)))).scalar() or 0
    consumed = _count_state(orders_db, table, OutboxState.CONSUMED)
    rejected = _count_state(orders_db, table, OutboxState.REJECTED)
    delivered = sum(counts.values())
    busy = counts[Outcome.BUSY]
    valid = orders - 1
    checks = [
        _pending_redelivery(transport, GROUP) is None,
        again == rows[0]["message_id"],
        relayed == orders,
        effects == distinct == valid,
        counts[Outcome.DUPLICATE] == DUPLICATES,
        consumed == valid and rejected == 1,
        route.lost == sorted(lose),
    ]
    result_rows: list[tuple[str, object, str]] = [
        ("published", orders, "outbox rows; publishing order 1 again returned the same id"),
        ("sent by the relay", relayed, "after commit, from the outbox"),
        ("delivered", delivered, f"including {DUPLICATES} duplicates injected on purpose"
         + (f" and {busy} redelivered (the first copy still held its Redis lease)"
            if busy else "")),
        ("duplicates skipped", counts[Outcome.DUPLICATE], "dedupe on ckit_id: no second effect"),
        ("effects applied", effects, f"stock reservations, one per valid order ({valid})"),
        ("rejected", rejected, "unknown SKU: reason stored, outbox row REJECTED"),
        ("consumed (receipts)", consumed_before, f"{len(route.lost)} receipt lost on purpose"),
        ("repaired", repaired, "reconciler: receipt lost -> CONSUMED"),
        ("consumed (final)", consumed, "every valid order"),
    ]
    transport.close()
    orders_db.dispose()
    inventory_db.dispose()
    return DemoResult(result_rows, all(checks), root)


def _pending_redelivery(transport: SqlTransport, group: str) -> dt.datetime | None:
    """When the next redelivery of `group` is due (still waiting in its retry topic)."""
    m = transport.tables.message
    with transport.db.engine.connect() as conn:
        due: dt.datetime | None = conn.execute(
            sa.select(sa.func.min(m.c.deliver_at)).where(
                m.c.topic == retry_topic(group), m.c.queue_offset.is_(None))).scalar()
    return due


def _count_state(engine: sa.engine.Engine, table: sa.Table, state: OutboxState) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)
                                .where(table.c.state == int(state))).scalar() or 0)


def _engine(choice: str) -> str:
    """`auto`: Spark when pyspark, java and the SQLite JDBC driver are all there, else SQL."""
    if choice != "auto":
        return choice
    try:
        import pyspark  # noqa: F401

        from spark.jdbc import find_jars
    except ImportError:
        return "sql"
    if shutil.which("java") is None:
        return "sql"
    try:
        return "spark" if find_jars({"sqlite"}) else "sql"
    except Exception:
        return "sql"


