"""A connection lost between the pool's pre-ping and the relay's isolation level is an outage
the relay waits out: the engine option that set the level raised that driver error unwrapped (a
bare `pymysql.err.OperationalError`), which the relay used to let through and die of;
`read_committed` now raises SQLAlchemy's (tests/test_read_committed.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from consumer_kit.core.states import OutboxState
from outbox_producer import Relay
from outbox_producer import relay as relay_module
from tests.conftest import Db
from tests.producer.test_relay_partial import outbox_states
from tests.producer.test_retention import publish
from tests.recording import RecordingTransport


def relay_through_lost_connections(db: Db, engine: sa.Engine,
                                   end: Callable[[Any], None], rows: int) -> None:
    """Publish `rows` due rows in `db`, then drain them with a relay on `engine` whose first
    five connections `end` ends (given each DB-API connection) just as the pool hands it
    over: its clock check's, its gauges' (both skipped for an outage) and at least three of
    its batches. Asserts that the relay waited the lost connections out and sent every row
    once."""
    ids = publish(db, range(rows))
    kills = [5]

    def end_first_five(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if kills[0] > 0:
            kills[0] -= 1
            end(dbapi_connection)

    sa.event.listen(engine, "checkout", end_first_five)
    transport = RecordingTransport()
    try:
        result = Relay(engine, transport, table=db.names.outbox).run_once()
    finally:
        engine.dispose()
    assert kills == [0] and result.errors >= 1
    assert transport.counts() == {m: 1 for m in ids}
    assert set(outbox_states(db.engine, db.names.outbox).values()) == {OutboxState.SENT}


@pytest.mark.mariadb
def test_a_connection_killed_as_the_relay_checks_it_out_is_waited_out(
        mariadb: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given due rows, and a database that kills the relay's first five connections just as
    # the pool hands them over (after their pre-ping)
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.05, 0.1))
    killer = make_engine(mariadb.url)

    def kill(dbapi_connection: Any) -> None:
        with killer.connect() as conn:
            conn.exec_driver_sql(f"KILL {dbapi_connection.thread_id()}")

    try:
        # When the relay drains them, then it waits the lost connections out, sending each once
        relay_through_lost_connections(mariadb, make_engine(mariadb.url), kill, rows=5)
    finally:
        killer.dispose()
