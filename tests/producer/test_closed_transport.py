"""A transport closed before the dispatcher or relay that sends through it (a shutdown in the
wrong order) is no message's fault: the rows stay as they were, no retry counted. It used to
charge each row a failed attempt, so a row with `max_retries=0` was FAILED without being sent.
A dispatcher never started, or closed, leaves committed rows to the relay and says so, instead
of queueing them (bodies and all) where no thread takes them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.errors import ConfigError, TransportClosed, TransportError
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import Transport
from outbox_producer import Dispatcher, Outbox, Relay
from tests.conftest import Db
from tests.recording import RecordingTransport


def closed_transport(url: str) -> Transport:
    """A RocketMQ transport, closed before its first send (no broker is reached)."""
    try:
        transport = open_transport(url)
        if url.startswith("rocketmq5"):
            from consumer_kit.transports.rocketmq5 import client

            client.v5()
        else:
            from consumer_kit.transports.rocketmq import native

            native.client()
    except ConfigError as exc:  # the client library is not installed here
        pytest.skip(f"{url}: {exc}")
    transport.close()
    return transport


def states(db: Db) -> list[tuple[int, int, str | None]]:
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        return [(int(s), int(r), f) for s, r, f in conn.execute(
            sa.select(t.c.state, t.c.retry_count, t.c.fail_reason))]


@pytest.mark.parametrize("url", ["rocketmq://127.0.0.1:9876", "rocketmq5://127.0.0.1:8081"])
def test_a_closed_transport_charges_no_row_a_retry_nor_fails_one(sqlite_db: Db,
                                                                  url: str) -> None:
    # Given a transport closed before the dispatcher and the relay send through it, and an
    # outbox that allows no retry
    transport = closed_transport(url)
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox).start()
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox,
                    dispatcher=dispatcher, max_retries=0)
    try:
        # When the dispatcher gets a committed row
        with Session(sqlite_db.engine) as session, session.begin():
            outbox.publish(session, "T", {"v": 1}, biz_type="t", biz_key="1")
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    # Then it is left to the relay as it was
    pending = [(int(OutboxState.PENDING), 0, None)]
    assert states(sqlite_db) == pending
    # And a relay on the closed transport stops with the reason, moving no row
    with pytest.raises(TransportError, match="closed"):
        Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox).run_once()
    assert states(sqlite_db) == pending


class ClosedTransport(RecordingTransport):
    """A transport that says it was closed, as the RocketMQ ones do (any machine)."""

    def send(self, message: OutgoingMessage) -> SendResult:
        raise TransportClosed("the transport is closed (simulated)")


def test_a_relay_on_a_transport_that_says_it_is_closed_moves_no_row_and_charges_none(
        sqlite_db: Db) -> None:
    # Given three due rows that allow no retry
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox,
                    max_retries=0)
    with sqlite_db.engine.begin() as conn:
        for key in ("1", "2", "3"):
            outbox.publish(conn, "T", {"v": key}, biz_type="t", biz_key=key)
    # When a relay sends through a transport closed under it
    with pytest.raises(TransportClosed, match="closed"):
        Relay(sqlite_db.engine, ClosedTransport(), table=sqlite_db.names.outbox).run_once()
    # Then every row is back as it was: none FAILED without being sent, no retry counted
    assert states(sqlite_db) == [(int(OutboxState.PENDING), 0, None)] * 3


@pytest.mark.parametrize("when", ["never started", "closed"])
def test_a_dispatcher_not_running_holds_no_rows_in_memory_and_says_so_once(
        sqlite_db: Db, when: str, caplog: pytest.LogCaptureFixture) -> None:
    # Given a dispatcher its owner never started, or already closed
    dispatcher = Dispatcher(sqlite_db.engine, RecordingTransport(),
                            table=sqlite_db.names.outbox)
    if when == "closed":
        dispatcher.start().close()
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox,
                    dispatcher=dispatcher)
    # When rows commit
    for key in ("1", "2"):
        with Session(sqlite_db.engine) as session, session.begin():
            outbox.publish(session, "T", {"v": key}, biz_type="t", biz_key=key)
    # Then they are left to the relay (PENDING), not queued where nothing would take them
    assert dispatcher.worker.queue.qsize() == 0
    assert states(sqlite_db) == [(int(OutboxState.PENDING), 0, None)] * 2
    said = [r.getMessage() for r in caplog.records if "dispatcher is not running" in
            r.getMessage()]
    assert len(said) == 1
