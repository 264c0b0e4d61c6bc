"""Delayed checks instead of polling: the dispatcher schedules a check per batch, and the check,
not a poll, re-sends a row still unsent (SQLite and the memory transport; the bench measures
what it saves: bench/delayed_check.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.errors import TransportError
from consumer_kit.core.messages import ConsumeStatus, Delivery, OutgoingMessage, SendResult
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Backoff, Dispatcher, Outbox
from outbox_producer.checks import Checker, CheckRequest, CheckScheduler, database_key
from tests.conftest import Db

TOPIC = "ckit-check-test"


class FirstSendFails(MemoryTransport):
    """Fails the first send of each outbox message (topic T); counts the sends that went out."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.tried: set[str] = set()
        self.sent: Counter[str] = Counter()
        self.checks = 0
        self.fail = True

    def send(self, message: OutgoingMessage) -> SendResult:
        mid = message.properties.get("ckit_id")
        if message.topic == TOPIC:
            with self.lock:
                self.checks += 1
        if mid is not None:
            with self.lock:
                first = mid not in self.tried
                self.tried.add(mid)
            if first and self.fail:
                raise TransportError("rejected (simulated)")
        result = super().send(message)
        if mid is not None:
            with self.lock:
                self.sent[mid] += 1
        return result


@pytest.fixture
def transport() -> Iterator[FirstSendFails]:
    t = FirstSendFails()
    yield t
    t.close()


@contextlib.contextmanager
def checker_for(db: Db, transport: MemoryTransport) -> Iterator[Checker]:
    """A checker of `db`'s checks consuming them from `transport` for the block."""
    checker = Checker(db.engine, outbox_table(sa.MetaData(), db.names.outbox), transport,
                      topic=TOPIC, backoff=Backoff(schedule=(0.0,), jitter=0.0))
    consumer = checker.consumer(transport)
    consumer.start()
    try:
        yield checker
    finally:
        consumer.shutdown()


def state_of(db: Db, mid: str) -> OutboxState:
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        return OutboxState(conn.execute(sa.select(t.c.state).where(t.c.message_id == mid))
                           .scalar_one())


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def publish_with(db: Db, dispatcher: Dispatcher, keys: range) -> list[str]:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    with Session(db.engine) as session, session.begin():
        return [outbox.publish(session, "T", {"k": k}, biz_type="t", biz_key=str(k))
                for k in keys]


def test_a_row_the_dispatcher_could_not_send_is_resent_by_its_check_not_by_a_poll(
        sqlite_db: Db, transport: FirstSendFails) -> None:
    # Given a dispatcher with delayed checks whose first send of each message fails
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                            backoff=Backoff(schedule=(0.0,), jitter=0.0),
                            check_topic=TOPIC, check_after=2).start()
    with checker_for(sqlite_db, transport) as checker:
        # When three rows are committed (and no relay runs at all)
        ids = publish_with(sqlite_db, dispatcher, range(3))
        assert dispatcher.flush(10)
        assert all(state_of(sqlite_db, m) is OutboxState.PENDING for m in ids)
        # Then their check sent each of them, once
        assert wait_for(lambda: all(state_of(sqlite_db, m) is OutboxState.SENT for m in ids))
        assert transport.sent == {m: 1 for m in ids}
        assert checker.stats.resent == 3 and checker.stats.checks == 1
    dispatcher.close()


@pytest.mark.parametrize("every_batch", [False, True])
def test_a_dispatcher_schedules_checks_for_what_it_could_not_send_or_for_every_batch(
        sqlite_db: Db, transport: FirstSendFails, every_batch: bool) -> None:
    # Given a dispatcher with checks whose sends all go through
    transport.fail = False
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                            check_topic=TOPIC, check_after=60, check_every_batch=every_batch)
    dispatcher.start()
    # When two transactions commit
    publish_with(sqlite_db, dispatcher, range(2))
    publish_with(sqlite_db, dispatcher, range(2, 4))
    assert dispatcher.flush(10)
    dispatcher.close()
    # Then no check was needed, unless every batch schedules one (before it is sent)
    assert len(transport.sent) == 4
    assert transport.checks in ((1, 2) if every_batch else (0,))  # 1 or 2 batches


def test_a_check_of_rows_already_sent_costs_one_lookup_and_sends_nothing(
        sqlite_db: Db, transport: FirstSendFails) -> None:
    # Given rows the dispatcher sent at once
    transport.fail = False
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox).start()
    ids = publish_with(sqlite_db, dispatcher, range(5))
    assert dispatcher.flush(10)
    dispatcher.close()
    t = outbox_table(sa.MetaData(), sqlite_db.names.outbox)
    with sqlite_db.engine.connect() as conn:
        row_ids = list(conn.execute(sa.select(t.c.id)).scalars())
    checker = Checker(sqlite_db.engine, t, transport, topic=TOPIC)
    statements: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    # When their check comes due
    sa.event.listen(sqlite_db.engine, "before_cursor_execute", count)
    try:
        assert checker.check(row_ids) is None
    finally:
        sa.event.remove(sqlite_db.engine, "before_cursor_execute", count)
    # Then it read them once by primary key and sent nothing
    assert len(statements) == 1 and transport.sent == {m: 1 for m in ids}


def test_a_row_waiting_for_its_back_off_gets_a_check_at_its_due_time(
        sqlite_db: Db, transport: FirstSendFails) -> None:
    # Given a dispatcher whose failed send waits 1.5 s before the retry, checks after 0.2 s
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                            backoff=Backoff(schedule=(1.5,), jitter=0.0),
                            check_topic=TOPIC, check_after=0.2).start()
    with checker_for(sqlite_db, transport) as checker:
        # When a row is committed
        (mid,) = publish_with(sqlite_db, dispatcher, range(1))
        # Then the first check finds it in back-off and schedules another, which sends it
        assert wait_for(lambda: state_of(sqlite_db, mid) is OutboxState.SENT)
        assert checker.stats.rescheduled >= 1 and transport.sent == {mid: 1}
    dispatcher.close()


def test_rows_left_by_a_dispatcher_that_died_after_scheduling_their_check_are_sent(
        sqlite_db: Db, transport: FirstSendFails) -> None:
    # Given committed rows whose check was scheduled, then nothing else (the process died)
    transport.fail = False
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    with sqlite_db.engine.begin() as conn:
        ids = [outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=str(k))
               for k in range(4)]
    t = outbox_table(sa.MetaData(), sqlite_db.names.outbox)
    with sqlite_db.engine.connect() as conn:
        row_ids = list(conn.execute(sa.select(t.c.id)).scalars())
    CheckScheduler(transport, TOPIC, database_key(sqlite_db.engine), 0.2).schedule(row_ids)
    with checker_for(sqlite_db, transport):
        # Then the check sends them
        assert wait_for(lambda: all(state_of(sqlite_db, m) is OutboxState.SENT for m in ids))
        assert transport.sent == {m: 1 for m in ids}


def test_a_check_message_of_another_database_or_unreadable_is_acked_and_ignored(
        sqlite_db: Db, transport: FirstSendFails) -> None:
    checker = Checker(sqlite_db.engine, outbox_table(sa.MetaData(), sqlite_db.names.outbox),
                      transport, topic=TOPIC)
    other = CheckRequest("elsewhere", (1, 2)).to_message(TOPIC, 1.0)
    for body in (other.body, b"not json"):
        delivery = Delivery(topic=TOPIC, body=body, broker_message_id="B")
        assert checker.handle(delivery) is ConsumeStatus.CONSUME_SUCCESS
    assert checker.stats.checks == 0


def test_checks_and_replica_scans_change_rows_only_through_the_transition_table(
        sqlite_db: Db, transport: FirstSendFails, tmp_path: Path) -> None:
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.schema import build_metadata
    from consumer_kit.core.states import TRANSITIONS, Actor
    from outbox_producer import Relay
    from tests.test_state_machine import Statements

    statements = Statements(sqlite_db.names.outbox)
    try:
        # Given a failed dispatcher send re-sent by its check
        dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                                backoff=Backoff(schedule=(0.0,), jitter=0.0),
                                check_topic=TOPIC, check_after=0.2).start()
        with checker_for(sqlite_db, transport):
            ids = publish_with(sqlite_db, dispatcher, range(2))
            assert wait_for(lambda: all(state_of(sqlite_db, m) is OutboxState.SENT
                                        for m in ids))
        dispatcher.close()
        # and rows claimed through a (here empty, so swept) read replica
        replica = make_engine(f"sqlite:///{tmp_path / 'replica.db'}")
        build_metadata(sqlite_db.names, include_transport=False).create_all(replica)
        more = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
        with sqlite_db.engine.begin() as conn:
            more.publish(conn, "T", {}, biz_type="t", biz_key="r")
        transport.fail = False
        Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox, read_engine=replica,
              sweep_every=0).run_once()
    finally:
        statements.close()
    # Then every UPDATE of the outbox named its transition, and only senders' transitions ran
    assert [s for s in statements.seen if s[1] is None] == []
    sender = {t.name for t in TRANSITIONS if t.actor is Actor.SENDER}
    assert {name for _, name in statements.seen} <= sender
    assert {name for _, name in statements.seen} >= {"claim", "mark_sent"}
