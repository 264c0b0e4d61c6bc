"""PostgreSQL through pg8000, the pure-Python driver, when the server drops a connection: pg8000
raises the socket's own `ConnectionResetError` when the drop is seen on a read (SQLAlchemy wraps
only DB-API errors), also while `read_committed` sets its level. Each is SQLAlchemy's error,
an outage, with the pool's dead connections discarded; an `OSError` that is not the network's
stays what it is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core import network_errors
from consumer_kit.core.db import make_engine, read_committed
from consumer_kit.core.db_errors import is_transient
from consumer_kit.core.states import OutboxState
from outbox_producer import Relay
from outbox_producer import relay as relay_module
from tests.conftest import Db, database_url
from tests.producer.test_relay_partial import outbox_states
from tests.producer.test_retention import publish
from tests.recording import RecordingTransport

pytestmark = pytest.mark.postgresql


@pytest.fixture
def pg8000_url(tmp_path: Path) -> str:
    return database_url("pg8000", tmp_path)


@pytest.fixture
def terminate(tmp_path: Path) -> Iterator[Any]:
    """`terminate(engine, n)`: check out `n` connections of `engine`, give them back, and end
    their server backends (pg_terminate_backend, from a connection of psycopg's)."""
    killer = make_engine(database_url("postgresql", tmp_path), poolclass=sa.pool.NullPool)

    def run(engine: sa.Engine, n: int) -> None:
        conns = [engine.connect() for _ in range(n)]
        pids = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar() for c in conns]
        for conn in conns:
            conn.close()
        with killer.connect() as conn:
            for pid in pids:
                conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
            for _ in range(100):  # the backends are gone once the server says so
                if not conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%(p)s)",
                        {"p": pids}).scalar():
                    break

    try:
        yield run
    finally:
        killer.dispose()


def test_a_connection_dropped_before_read_committed_sets_its_level_is_an_outage_that_frees_it(
        pg8000_url: str, terminate: Any) -> None:
    # Given a pool of one connection whose backend is gone
    engine = make_engine(pg8000_url, pool_size=1, max_overflow=0, pool_timeout=1)
    view = read_committed(engine)
    try:
        terminate(engine, 1)
        # When a read_committed transaction begins on it
        with pytest.raises(sa.exc.DBAPIError) as lost, view.begin():
            pass
        status = engine.pool.status()
        # Then it is SQLAlchemy's error, an outage, and the pool's next connection works
        with view.begin() as conn:
            level = conn.exec_driver_sql("SHOW transaction_isolation").scalar()
    finally:
        engine.dispose()
    assert is_transient(lost.value, "postgresql") and lost.value.connection_invalidated
    assert "Checked out connections: 0" in status and level == "read committed"


def test_one_lost_connection_discards_the_pools_other_dead_ones(
        pg8000_url: str, terminate: Any) -> None:
    # Given a pool of three connections whose backends are all gone (a server restart)
    engine = make_engine(pg8000_url, pool_size=3, max_overflow=0, pool_timeout=1)
    view = read_committed(engine)
    outcomes = []
    try:
        terminate(engine, 3)
        # When four read_committed transactions run one after another
        for _ in range(4):
            try:
                with view.begin() as conn:
                    conn.exec_driver_sql("SELECT 1")
                outcomes.append("ok")
            except sa.exc.DBAPIError:
                outcomes.append("lost")
    finally:
        engine.dispose()
    # Then only the first met a dead connection (it used to be one outage per connection)
    assert outcomes == ["lost", "ok", "ok", "ok"]


def test_an_os_error_that_is_not_the_networks_is_not_made_an_outage(pg8000_url: str) -> None:
    # Given a pg8000 engine with a tracing hook that cannot write its file
    engine = make_engine(pg8000_url)

    def trace(*_: Any) -> None:
        raise PermissionError(13, "Permission denied", "/var/log/trace.log")

    sa.event.listen(engine, "after_cursor_execute", trace)
    try:
        # When a statement runs, then the hook's own error comes out, not a disconnect
        with pytest.raises(PermissionError), engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    finally:
        engine.dispose()


def test_a_dropped_connections_error_keeps_hidden_parameters_hidden(
        pg8000_url: str, terminate: Any) -> None:
    # Given an engine that hides statement parameters, whose one connection's backend is gone
    engine = make_engine(pg8000_url, pool_size=1, max_overflow=0, hide_parameters=True)
    try:
        terminate(engine, 1)
        # When a statement with a secret parameter runs on it
        with pytest.raises(sa.exc.DBAPIError) as lost, engine.connect() as conn:
            conn.exec_driver_sql("SELECT %s", ("secret-value",))
    finally:
        engine.dispose()
    # Then the error says it was lost, not the parameter
    assert lost.value.connection_invalidated and "secret-value" not in str(lost.value)


def test_the_socket_errors_disconnect_hides_parameters_when_the_engine_does() -> None:
    # Given the hook's view of a bare reset on a statement of an engine hiding parameters
    # (the path a reset takes on pg8000's first read of an answer; the test above may see the
    # write fail first, which SQLAlchemy wraps itself)
    context = SimpleNamespace(
        original_exception=ConnectionResetError(104, "Connection reset by peer"),
        sqlalchemy_exception=None, statement="SELECT %s", parameters=("secret-value",),
        engine=SimpleNamespace(hide_parameters=True), is_disconnect=False)
    # When the hook judges it
    error = network_errors._socket_error_as_disconnect(context)  # type: ignore[arg-type]
    # Then it is a disconnect whose text keeps the parameter out
    assert isinstance(error, sa.exc.OperationalError) and context.is_disconnect
    assert error.connection_invalidated and "secret-value" not in str(error)


@pytest.mark.parametrize("db", ["pg8000"], indirect=True)
def test_a_relay_waits_out_its_pools_connections_dropped_by_a_restart(
        db: Db, terminate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given due rows, and a relay through pg8000 whose pooled connections all died
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.05, 0.1))
    ids = publish(db, range(3))
    engine = make_engine(db.url, pool_size=2, max_overflow=0)
    transport = RecordingTransport()
    try:
        terminate(engine, 2)
        # When it drains them
        result = Relay(engine, transport, table=db.names.outbox).run_once()
    finally:
        engine.dispose()
    # Then it sent every row once (it used to die of the bare ConnectionResetError)
    assert transport.counts() == {m: 1 for m in ids} and result.stats.sent == 3
    assert set(outbox_states(db.engine, db.names.outbox).values()) == {OutboxState.SENT}
