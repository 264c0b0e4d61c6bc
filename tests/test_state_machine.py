"""The outbox state machine has one transition table, and every writer goes through it.

A scenario drives every writer of the outbox (dispatcher and relay, receipt applier, operator
commands, reconciler, archive) on SQLite while a SQLAlchemy hook records every statement that
changes the outbox. Each UPDATE or DELETE must carry the `ckit_transition` execution option of
`consumer_kit.core.transitions.cas` (no hand-written compare-and-set left anywhere), each state
change a row went through must be one the table allows, and the scenario must exercise every
transition of the table.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.receipt import Receipt, ReceiptOutcome
from consumer_kit.core.receipts_applier import ReceiptApplier
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import TRANSITIONS, Actor, OutboxState, allowed, leaving
from consumer_kit.core.transitions import OPTION
from consumer_kit.reconcile import GroupSource, ReconcileConfig, run_reconcile
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Backoff, Dispatcher, Outbox, Relay, ops
from tests.conftest import Db

ROOT = Path(__file__).resolve().parent.parent
#: The transitions of `--claim lock` (a relay holding row locks), proved on MariaDB/PostgreSQL.
LOCKED_MOVES = {"send_locked", "retry_locked", "give_up_locked"}


class Statements:
    """Every UPDATE/DELETE of the outbox table by any engine (the reconciler opens its own),
    with its transition option."""

    def __init__(self, table: str) -> None:
        self.seen: list[tuple[str, str | None]] = []
        # (a claim may start with a CTE: WITH picked AS (...) UPDATE <table> ...; a batch mark
        # on MariaDB joins its rows first: UPDATE JSON_TABLE(...) AS v STRAIGHT_JOIN <table>)
        self.pattern = re.compile(
            rf"^\s*(WITH\b.*?\)\s*)?(UPDATE|DELETE FROM)\s+"
            rf"(JSON_TABLE\(.*?\)\s+AS\s+\w+\s+STRAIGHT_JOIN\s+)?{table}\b", re.I | re.S)
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any,
                many: bool) -> None:
        found = self.pattern.match(statement)
        if found:
            option = context.execution_options.get(OPTION) if context is not None else None
            self.seen.append((found.group(2).upper(), option))

    def close(self) -> None:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", self._record)


class Flaky(MemoryTransport):
    """Fails sends on demand: `mode` None (ok), "row" (an error of the row), "down"."""

    def __init__(self) -> None:
        super().__init__()
        self.mode: str | None = None

    def send(self, message: OutgoingMessage) -> SendResult:
        if self.mode == "row":
            raise TransportError("rejected by the broker (simulated)")
        if self.mode == "down":
            raise TransportUnavailable("broker down (simulated)")
        return super().send(message)


@pytest.fixture
def watched(sqlite_db: Db) -> Iterator[tuple[Db, Statements]]:
    outbox = sqlite_db.names.outbox
    with sqlite_db.engine.begin() as conn:  # every state change a row goes through, exactly
        conn.exec_driver_sql("CREATE TABLE state_log (old INTEGER, new INTEGER)")
        conn.exec_driver_sql(
            f"CREATE TRIGGER {outbox}_moves AFTER UPDATE OF state ON {outbox} "
            "WHEN old.state <> new.state "
            "BEGIN INSERT INTO state_log VALUES (old.state, new.state); END")
    statements = Statements(outbox)
    try:
        yield sqlite_db, statements
    finally:
        statements.close()


def states(db: Db) -> dict[str, OutboxState]:
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        return {m: OutboxState(s) for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}


def force(db: Db, message_id: str, **values: Any) -> None:
    """Test set-up only: the statement is marked as such, and its state change is taken out of
    the log of moves."""
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.message_id == message_id).values(**values)
                     .execution_options(**{OPTION: "test-setup"}))
        conn.exec_driver_sql("DELETE FROM state_log WHERE rowid = (SELECT max(rowid) "
                             "FROM state_log) AND changes() > 0")


def test_every_writer_moves_rows_only_through_the_transition_table(
        watched: tuple[Db, Statements], tmp_path: Path) -> None:
    db, statements = watched

    def step() -> None:
        """(The trigger records the moves; steps only mark the scenario's phases.)"""

    names = db.names
    transport = Flaky()
    outbox = Outbox(db.engine, producer="orders", table=names.outbox, max_retries=1)

    def publish(key: str) -> str:
        with db.engine.begin() as conn:
            return outbox.publish(conn, "T", {"k": key}, biz_type="t", biz_key=key)

    # Given the dispatcher sending a committed row (claim, mark_sent)
    dispatcher = Dispatcher(db.engine, transport, table=names.outbox).start()
    with_dispatcher = Outbox(db.engine, producer="orders", table=names.outbox,
                             dispatcher=dispatcher)
    with Session(db.engine) as session, session.begin():
        sent = with_dispatcher.publish(session, "T", {"k": "d"}, biz_type="t", biz_key="d")
    assert dispatcher.flush(10)
    dispatcher.close()
    step()
    # a relay whose sends fail for the row (retry_later, then give_up), ...
    relay = Relay(db.engine, transport, table=names.outbox,
                  backoff=Backoff(schedule=(0,), jitter=0), failed_retry_after=dt.timedelta(0))
    failing = publish("f")
    transport.mode = "row"
    relay.step()
    step()
    relay.step()
    step()
    assert states(db)[failing] is OutboxState.FAILED
    # ... a slow retry of the FAILED row (claim_failed), an outage (release of a row claimed
    # from PENDING, release_failed of the one claimed from FAILED), ...
    publish("o")
    transport.mode = "down"
    relay.step()
    step()
    transport.mode = None
    relay.run_once()
    step()
    # ... and a lease that expired (reclaim)
    expired = publish("e")
    force(db, expired, state=int(OutboxState.SENDING), lease_until=utcnow() - dt.timedelta(1))
    relay.run_once()
    step()
    # When receipts arrive (consume, reject)
    rejected = publish("r")
    relay.run_once()
    step()
    applier = ReceiptApplier(db.engine, table=names.outbox, receipt_table_name=names.receipts)
    applier.apply([Receipt(sent, "inventory"),
                   Receipt(rejected, "inventory", ReceiptOutcome.REJECTED, "bad")])
    step()
    # ... and a group that rejected a message consumes a later delivery of it (consume_rejected)
    rerun = publish("u")
    relay.run_once()
    applier.apply([Receipt(rerun, "inventory", ReceiptOutcome.REJECTED, "bad")])
    applier.apply([Receipt(rerun, "inventory")])
    assert states(db)[rerun] is OutboxState.CONSUMED
    step()
    # and an operator acts (retry, suspend, resume)
    tables = ops.OutboxTables.from_names(names)
    ops.retry(db.engine, tables, [f"msg:{rejected}"])
    step()
    ops.suspend(db.engine, tables.outbox, [f"msg:{rejected}"])
    step()
    ops.resume(db.engine, tables.outbox, [f"msg:{rejected}"])
    step()
    # and the reconciler repairs SENT rows of every kind, and a SENDING row
    group = f"sqlite:///{tmp_path / 'inventory.db'}"
    from consumer_kit.core.schema import processed_table

    inventory = sa.create_engine(group)
    processed = processed_table(sa.MetaData(), names.processed)
    processed.create(inventory)
    kinds = {name: publish(name) for name in ("lost", "rej", "resend", "exhausted", "stuck")}
    relay.run_once()
    old = utcnow() - dt.timedelta(hours=1)
    for name, mid in kinds.items():
        force(db, mid, sent_at=old, retry_count=1 if name == "exhausted" else 0)
    force(db, kinds["stuck"], state=int(OutboxState.SENDING), lease_until=old)
    with inventory.begin() as conn:
        for name, status in (("lost", "SUCCEEDED"), ("rej", "FAILED")):
            conn.execute(sa.insert(processed).values(
                consumer_group="inventory", message_id=kinds[name], topic="T", status=status,
                attempts=1, first_seen_at=old, processed_at=old))
    summary = run_reconcile(ReconcileConfig(
        producer_url=db.url, engine="sql", outbox_table=names.outbox,
        receipt_table=names.receipts, orphan_window=dt.timedelta(0),
        groups=(GroupSource("inventory", group, table=names.processed),)))
    assert summary.conflicts == 0
    step()
    inventory.dispose()
    # and archive moves terminal rows out
    ops.archive(db.engine, tables, dt.timedelta(microseconds=1))

    # Then every statement that changed the outbox named its transition
    untracked = [s for s in statements.seen if s[1] is None]
    assert untracked == []
    # and the scenario went through every transition of the table (but --claim lock's, which
    # SQLite cannot run: tests/producer/test_relay_lock.py watches them on the real servers)
    used = {name for _verb, name in statements.seen}
    expected = {t.name for t in TRANSITIONS} - LOCKED_MOVES
    assert expected <= used, sorted(expected - used)
    assert "archive" in used
    # and every state change a row went through is one the table allows
    with db.engine.connect() as conn:
        moves = {(OutboxState(a), OutboxState(b)) for a, b in conn.exec_driver_sql(
            "SELECT old, new FROM state_log")}
    forbidden = sorted(f"{a.name} -> {b.name}" for a, b in moves if not allowed(a, b))
    assert forbidden == [] and (OutboxState.SENT, OutboxState.CONSUMED) in moves


def test_the_table_answers_who_may_move_a_row_out_of_sent() -> None:
    who = {(t.actor, t.name) for t in leaving(OutboxState.SENT)}
    assert who == {
        (Actor.RECEIPTS, "consume"), (Actor.RECEIPTS, "reject"), (Actor.OPERATOR, "retry"),
        (Actor.RECONCILER, "repair_receipt_lost"), (Actor.RECONCILER, "repair_rejected"),
        (Actor.RECONCILER, "repair_resend"), (Actor.RECONCILER, "repair_exhausted"),
    }


def test_consumed_is_left_only_by_an_operator() -> None:
    assert {t.actor for t in leaving(OutboxState.CONSUMED)} == {Actor.OPERATOR}


def test_no_module_outside_the_core_builds_an_update_of_the_outbox() -> None:
    # Given every product module
    sources = [p for folder in ("consumer_kit", "outbox_producer", "spark")
               for p in (ROOT / folder).rglob("*.py")]
    # When they are searched for hand-written state changes
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if p.name != "transitions.py" and re.search(
                     r"\.values\([^)]*\bstate\s*=", p.read_text())]
    # Then only the compare-and-set helper sets a state
    assert offenders == []


def test_the_architecture_doc_lists_the_transition_table_of_the_code() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for t in TRANSITIONS:
        sources = "/".join(s.name for s in t.sources)
        forced = f" (+{'/'.join(s.name for s in t.forced)} with --force)" if t.forced else ""
        assert f"| `{t.name}` | {t.actor.value} | {sources}{forced} | {t.target.name} |" in doc
