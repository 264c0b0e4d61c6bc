"""The counts the run is judged by, read straight from the databases, and the verdict.

Invariants after the drain (and the reconciler): orders committed = expected; one outbox row per
order; effects = distinct effects = orders (none lost, none doubled); one processed row per order;
every outbox row CONSUMED. `leftovers` explains the rows that are not CONSUMED yet (before the
reconciler runs): a SENT row whose message was processed lost its receipt; one without a processed
row was never consumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.faults import kit, world

SAMPLE = 10

_outbox = sa.table(kit.OUTBOX_TABLE, sa.column("id"), sa.column("message_id"),
                   sa.column("topic"), sa.column("biz_key"), sa.column("state"),
                   sa.column("retry_count"), sa.column("fail_reason"))
_processed = sa.table(kit.PROCESSED_TABLE, sa.column("consumer_group"), sa.column("message_id"),
                      sa.column("status"))


@dataclasses.dataclass
class Snapshot:
    """Counts at one moment."""

    orders: int
    outbox_rows: int
    outbox_keys: int
    states: dict[str, int]
    effects: int
    distinct_effects: int
    processed: int
    processed_ok: int
    lost_sample: list[int]
    doubled_sample: list[dict[str, Any]]

    @property
    def lost(self) -> int:
        return self.orders - self.distinct_effects

    @property
    def doubled(self) -> int:
        return self.effects - self.distinct_effects

    @property
    def consumed(self) -> int:
        return self.states.get("CONSUMED", 0)

    def converged(self, expected: int) -> bool:
        """Everything arrived: every order committed, applied and its row CONSUMED."""
        return (self.orders == expected and self.outbox_rows == expected
                and self.consumed == expected and self.distinct_effects == expected
                and self.processed_ok == expected)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "lost": self.lost, "doubled": self.doubled}


def snapshot(orders: Engine, inventory: Engine) -> Snapshot:
    """Read every count (raises sqlalchemy errors when a database is down)."""
    o, e, p = world.orders, world.effects, _processed
    with orders.connect() as conn:
        n_orders = conn.execute(sa.select(sa.func.count()).select_from(o)).scalar_one()
        rows, keys = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(_outbox.c.biz_key)))
            .where(_outbox.c.topic == world.TOPIC)).one()
        states = {kit.STATE_NAMES.get(int(s), str(s)): int(n) for s, n in conn.execute(
            sa.select(_outbox.c.state, sa.func.count()).where(_outbox.c.topic == world.TOPIC)
            .group_by(_outbox.c.state))}
        order_ids = set(conn.execute(sa.select(o.c.id)).scalars())
    with inventory.connect() as conn:
        n_effects, distinct = conn.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(e.c.order_id)))).one()
        applied = set(conn.execute(sa.select(sa.distinct(e.c.order_id))).scalars())
        pids = (sa.func.string_agg(sa.cast(e.c.pid, sa.String), ",")
                if inventory.dialect.name == "postgresql" else sa.func.group_concat(e.c.pid))
        doubled = conn.execute(
            sa.select(e.c.order_id, sa.func.count().label("n"), pids.label("pids"))
            .group_by(e.c.order_id).having(sa.func.count() > 1).limit(SAMPLE)).all()
        processed, processed_ok = conn.execute(
            sa.select(sa.func.count(),
                      sa.func.coalesce(sa.func.sum(sa.case((p.c.status == "SUCCEEDED", 1),
                                                           else_=0)), 0))
            .where(p.c.consumer_group == world.GROUP)).one()
    return Snapshot(
        orders=int(n_orders), outbox_rows=int(rows), outbox_keys=int(keys), states=states,
        effects=int(n_effects), distinct_effects=int(distinct), processed=int(processed),
        processed_ok=int(processed_ok), lost_sample=sorted(order_ids - applied)[:SAMPLE],
        doubled_sample=[{"order_id": r.order_id, "effects": r.n, "pids": str(r.pids)}
                        for r in doubled],
    )


def leftovers(orders: Engine, inventory: Engine, stormed: set[str]) -> dict[str, Any]:
    """The outbox rows not CONSUMED, by state, and the SENT ones by cause: processed (its
    receipt was lost) or not processed, each split by whether a duplicate storm re-sent it."""
    with orders.connect() as conn:
        rows = conn.execute(sa.select(_outbox.c.message_id, _outbox.c.state)
                            .where(_outbox.c.topic == world.TOPIC,
                                   _outbox.c.state != kit.CONSUMED)).all()
    by_state: dict[str, int] = {}
    for r in rows:
        name = kit.STATE_NAMES.get(int(r.state), str(r.state))
        by_state[name] = by_state.get(name, 0) + 1
    sent = [r.message_id for r in rows if int(r.state) == kit.SENT]
    done: set[str] = set()
    with inventory.connect() as conn:
        for i in range(0, len(sent), 1000):
            done.update(conn.execute(sa.select(_processed.c.message_id).where(
                _processed.c.consumer_group == world.GROUP,
                _processed.c.message_id.in_(sent[i:i + 1000]))).scalars())
    causes = {"receipt_lost": 0, "receipt_lost_stormed": 0, "not_processed": 0,
              "not_processed_stormed": 0}
    for m in sent:
        key = "receipt_lost" if m in done else "not_processed"
        causes[key + ("_stormed" if m in stormed else "")] += 1
    return {"not_consumed": len(rows), "by_state": by_state, "sent_by_cause": causes,
            "sample": sent[:SAMPLE]}


def problems(snap: Snapshot, expected: int) -> list[str]:
    """What breaks an invariant (empty: everything holds)."""
    out = []
    if snap.orders != expected:
        out.append(f"{snap.orders} orders committed, expected {expected}")
    if snap.outbox_rows != snap.orders or snap.outbox_keys != snap.outbox_rows:
        out.append(f"{snap.outbox_rows} outbox rows ({snap.outbox_keys} distinct orders) for "
                   f"{snap.orders} orders")
    if snap.lost:
        out.append(f"{snap.lost} lost (orders without an effect, e.g. {snap.lost_sample})")
    if snap.doubled:
        out.append(f"{snap.doubled} doubled effects (e.g. {snap.doubled_sample[:3]})")
    if snap.processed != snap.orders or snap.processed_ok != snap.orders:
        out.append(f"{snap.processed} processed rows ({snap.processed_ok} SUCCEEDED) for "
                   f"{snap.orders} orders")
    if snap.consumed != snap.outbox_rows:
        others = {k: v for k, v in snap.states.items() if k != "CONSUMED"}
        out.append(f"{snap.outbox_rows - snap.consumed} outbox rows not CONSUMED {others}")
    return out


def dead_letters(transport_url: str) -> dict[str, Any]:
    """The group's dead letters on the transport (RocketMQ's `%DLQ%group`): messages whose
    retries were spent. Each is an order only a re-send (the reconciler's) can still apply."""
    transport = kit.open_transport(transport_url)
    try:
        letters = transport.dead_letters(world.GROUP)
    finally:
        transport.close()
    ids = [d.properties.get(kit.PROP_ID, "") for d in letters]
    reasons: dict[str, int] = {}
    for d in letters:
        reason = (d.last_error or "?").splitlines()[0][:120]
        reasons[reason] = reasons.get(reason, 0) + 1
    return {"count": len(letters), "messages": len(set(ids)), "sample": ids[:SAMPLE],
            "reasons": reasons}
