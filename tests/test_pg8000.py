"""PostgreSQL through pg8000, the pure-Python driver, when the server drops a connection: pg8000
raises the socket's own `ConnectionResetError` when the drop is seen on a read (SQLAlchemy wraps
only DB-API errors), also while `read_committed` sets its level, and as pg8000 connects. Each is
SQLAlchemy's error, an outage, with the pool's dead connections discarded; an `OSError` that is
not the network's stays what it is."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit.core import network_errors
from consumer_kit.core.db import make_engine, read_committed
from consumer_kit.core.db_errors import is_transient
from consumer_kit.core.errors import TransportUnavailable
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.schema.mq import mq_tables
from consumer_kit.transports.sql import SqlTransport
from consumer_kit.transports.sql.database import Database
from outbox_producer import Relay
from outbox_producer import relay as relay_module
from tests.conftest import Db, database_url
from tests.producer.test_relay_driver_errors import relay_through_lost_connections
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
            for pid in pids:  # waits up to 5 s for the backend to exit (PostgreSQL 14 or later)
                assert conn.exec_driver_sql(
                    f"SELECT pg_terminate_backend({pid}, 5000)").scalar(), pid

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


class ResetSocket:
    """A socket file whose peer reset the connection."""

    def read(self, size: int) -> bytes:
        raise ConnectionResetError(104, "Connection reset by peer")


def reset_in_pg8000() -> ConnectionResetError:
    """The bare error pg8000's own read raises on a reset connection (its traceback in pg8000)."""
    from pg8000 import core

    try:
        core._read(ResetSocket(), 5)
    except ConnectionResetError as error:
        return error
    raise AssertionError("pg8000 wrapped the reset: see consumer_kit/core/network_errors.py")


def hook_context(error: BaseException, engine: sa.Engine) -> SimpleNamespace:
    """What SQLAlchemy hands a `handle_error` hook for `error`, not wrapped, on `engine`."""
    return SimpleNamespace(original_exception=error, sqlalchemy_exception=None,
                           statement="SELECT %s", parameters=("secret-value",), engine=engine,
                           is_disconnect=False)


def test_the_socket_errors_disconnect_hides_parameters_when_the_engine_does(
        pg8000_url: str) -> None:
    # Given a reset raised in pg8000's read, on a statement of an engine hiding parameters (the
    # path a reset takes on the first read of an answer; the test above may see the write fail
    # first, which SQLAlchemy wraps itself)
    engine = make_engine(pg8000_url, hide_parameters=True)
    context = hook_context(reset_in_pg8000(), engine)
    # When the hook judges it
    error = network_errors._socket_error_as_disconnect(context)  # type: ignore[arg-type]
    engine.dispose()
    # Then it is a disconnect whose text keeps the parameter out
    assert isinstance(error, sa.exc.OperationalError) and context.is_disconnect
    assert error.connection_invalidated and "secret-value" not in str(error)


def test_a_connection_error_raised_outside_the_driver_is_not_made_a_disconnect(
        pg8000_url: str) -> None:
    # Given a tracing hook whose exporter's connection is refused, on a pg8000 engine
    engine = make_engine(pg8000_url)

    def trace(*_: Any) -> None:
        raise ConnectionRefusedError(111, "Connection refused (the trace collector)")

    sa.event.listen(engine, "after_cursor_execute", trace)
    try:
        # When a statement runs, then the hook's own error comes out, the pool kept
        with pytest.raises(ConnectionRefusedError), engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        invalidated = engine.pool._invalidate_time
    finally:
        engine.dispose()
    assert invalidated == 0


@pytest.mark.parametrize("built_by", ["the caller", "the SQL transport"])
def test_engines_not_made_from_a_url_by_make_engine_get_the_same_guard(
        pg8000_url: str, built_by: str) -> None:
    # Given a pg8000 engine the caller built and handed to consumer-kit, or the SQL transport's
    if built_by == "the caller":
        engine = make_engine(sa.create_engine(pg8000_url))
    else:
        engine = Database(pg8000_url, mq_tables("ckit_mq")).engine
    try:
        # When pg8000's read raises a reset on it
        context = hook_context(reset_in_pg8000(), engine)
        guarded = sa.event.contains(engine, "handle_error",
                                    network_errors._socket_error_as_disconnect)
        error = network_errors._socket_error_as_disconnect(context)  # type: ignore[arg-type]
    finally:
        engine.dispose()
    # Then the engine's hook makes it a disconnect
    assert guarded and isinstance(error, sa.exc.OperationalError) and context.is_disconnect


@pytest.mark.parametrize("db", ["pg8000"], indirect=True)
def test_a_relay_waits_out_connections_dropped_as_it_checks_them_out(
        db: Db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given due rows, and a server that ends the relay's first five connections' backends just
    # as the pool hands them over
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.05, 0.1))
    killer = make_engine(database_url("postgresql", tmp_path), poolclass=sa.pool.NullPool)

    def end_backend(dbapi_connection: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
        dbapi_connection.rollback()
        with killer.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)").scalar()

    try:
        # When the relay drains them, then it waits the lost connections out, sending each
        # once (it used to die of the bare ConnectionResetError)
        relay_through_lost_connections(db, make_engine(db.url), end_backend, rows=3)
    finally:
        killer.dispose()


@pytest.fixture
def resetting_url() -> Iterator[str]:
    """A pg8000 URL of a loopback port that accepts each connection, reads its start-up message
    and resets it (as a load balancer with no backend up does); closed after the test."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.settimeout(5)
                conn.recv(4096)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, name="resetting-server", daemon=True)
    thread.start()
    try:
        yield f"postgresql+pg8000://ckit:s3cret@127.0.0.1:{port}/ckit_test"
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not, on Linux)
        server.close()
        thread.join(10)
        assert not thread.is_alive(), "the resetting server did not stop"


def test_a_connection_reset_as_pg8000_connects_is_an_outage_not_a_bare_socket_error(
        resetting_url: str) -> None:
    # Given a server that resets each connection after its start-up message
    engine = make_engine(resetting_url)
    try:
        # When consumer-kit connects through pg8000, then the error is SQLAlchemy's, an outage
        # (pg8000 let the socket's ConnectionResetError through, which nothing waited out)
        with pytest.raises(sa.exc.InterfaceError) as caught, engine.connect():
            pass
    finally:
        engine.dispose()
    assert is_transient(caught.value, "postgresql")
    assert "network error on connect: ConnectionResetError" in str(caught.value)


def test_a_relay_and_the_sql_transport_wait_out_resets_as_pg8000_connects(
        resetting_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a server that resets every connection as pg8000 starts it
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.05, 0.1))
    engine = make_engine(resetting_url)
    try:
        # When a relay runs --once on it, then it waits the outage out, then gives up
        result = Relay(engine, RecordingTransport(), table="ckit_outbox",
                       once_outage_limit=0.5).run_once()
    finally:
        engine.dispose()
    assert result.gave_up is not None and "network error on connect" in result.gave_up
    assert "s3cret" not in result.gave_up
    # and the SQL transport's send waits for `unavailable_after`, then says it is unavailable
    with SqlTransport(resetting_url, unavailable_after=0.5) as transport, \
            pytest.raises(TransportUnavailable, match=r"unavailable for 0\.5s") as caught:
        transport.send(OutgoingMessage("orders", b"x"))
    assert "s3cret" not in str(caught.value)


def test_a_callers_own_connect_hook_still_runs_on_a_guarded_engine(pg8000_url: str) -> None:
    # Given a pg8000 engine consumer-kit guards, with a wrong password, and the caller's own
    # do_connect hook that puts the right one in (SQLAlchemy's documented way to hand over a
    # fresh password or token); and the engine guarded again, also through a derived engine
    right = sa.make_url(pg8000_url).password
    engine = make_engine(sa.make_url(pg8000_url).set(password="wrong").render_as_string(
        hide_password=False))
    make_engine(engine)
    make_engine(engine.execution_options(logging_token="x"))
    calls: list[int] = []

    @sa.event.listens_for(engine, "do_connect")
    def fresh_password(_dialect: Any, _record: Any, _cargs: Any, cparams: Any) -> None:
        calls.append(1)
        cparams["password"] = right

    try:
        # When it connects, then the caller's hook ran and the connection works
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()
    assert calls == [1]
    # and the dialect's connect is wrapped once, however often the engine was guarded
    wrapped = engine.dialect.connect
    assert getattr(wrapped, network_errors._WRAPPED)
    assert not getattr(wrapped.__wrapped__, network_errors._WRAPPED, False)  # type: ignore[attr-defined]
