"""A connection lost between the pool's pre-ping and the relay's isolation level is an outage
the relay waits out: the engine option that set the level raised that driver error unwrapped (a
bare `pymysql.err.OperationalError`), which the relay used to let through and die of;
`read_committed` now raises SQLAlchemy's (tests/test_read_committed.py)."""

from __future__ import annotations

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


@pytest.mark.mariadb
def test_a_connection_killed_as_the_relay_checks_it_out_is_waited_out(
        mariadb: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given due rows, and a database that kills the relay's first five connections just as
    # the pool hands them over (after their pre-ping): its clock check's, its gauges' (both
    # skipped for an outage) and at least three of its batches
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.05, 0.1))
    ids = publish(mariadb, range(5))
    engine = make_engine(mariadb.url)
    killer = make_engine(mariadb.url)
    kills = [5]

    def kill(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if kills[0] > 0:
            kills[0] -= 1
            with killer.connect() as conn:
                conn.exec_driver_sql(f"KILL {dbapi_connection.thread_id()}")

    sa.event.listen(engine, "checkout", kill)
    transport = RecordingTransport()
    try:
        # When the relay drains them
        result = Relay(engine, transport, table=mariadb.names.outbox).run_once()
    finally:
        engine.dispose()
        killer.dispose()
    # Then it waited the lost connections out and sent every row once
    assert kills == [0] and result.errors >= 1
    assert transport.counts() == {m: 1 for m in ids}
    assert set(outbox_states(mariadb.engine, mariadb.names.outbox).values()) == {
        OutboxState.SENT}
