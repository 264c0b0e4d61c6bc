"""pg8000 and SQLAlchemy's pool pre-ping (`pool_pre_ping=True`, which a caller's engine may set)
when the server has dropped the pooled connection. psycopg's pre-ping turns that into a new
connection, unseen. pg8000's did not: a reset met on the pre-ping's first read came out of
`engine.connect()` as the socket's bare `ConnectionResetError` (SQLAlchemy's pre-ping takes only
DB-API errors for a disconnect), which a consumer reported as its handler's failure and
retried; and a drop pg8000 did report ("network error") was replaced unseen, but pg8000's
`close()` of the dead connection raised, which the pool logged at ERROR with a traceback."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Outcome
from consumer_kit.core import network_errors
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.transports import Delivery
from consumer_kit.transports.memory import MemoryTransport
from tests.conftest import database_url

pytestmark = pytest.mark.postgresql


class ResettingProxy:
    """A TCP proxy to the test PostgreSQL server. When the server closes a connection (its
    backend terminated), the proxy keeps the client's side open and resets it at the client's
    next write, as a load balancer or a NAT that lost the flow answers: the client's write goes
    out, and its next read meets the reset."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.resets = 0
        self._closed = threading.Semaphore(0)  # one release per connection the server closed
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="race-proxy", daemon=True)]
        self._threads[0].start()

    def wait_server_closed(self) -> None:
        assert self._closed.acquire(timeout=10), "the server did not close the connection"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            server = socket.create_connection(self.upstream, timeout=5)
            server.settimeout(None)
            self._sockets += [client, server]
            closed = threading.Event()
            for pump in (self._down, self._up):
                thread = threading.Thread(target=pump, args=(client, server, closed),
                                          name="race-proxy-pump", daemon=True)
                self._threads.append(thread)
                thread.start()

    def _down(self, client: socket.socket, server: socket.socket, closed: threading.Event
              ) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            return
        closed.set()  # the server closed it: the client's next write is answered by a reset
        self._closed.release()

    def _up(self, client: socket.socket, server: socket.socket, closed: threading.Event
            ) -> None:
        try:
            while data := client.recv(65536):
                if closed.is_set():
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
                    client.close()  # an RST, not a FIN
                    self.resets += 1
                    return
                server.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self.listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):  # wakes a pump blocked in recv (close does not)
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(10)
        assert not any(t.is_alive() for t in self._threads), "the proxy did not stop"


@pytest.fixture
def killer(tmp_path: Path) -> Iterator[sa.Engine]:
    """A psycopg engine of the same server, to end backends with."""
    engine = make_engine(database_url("postgresql", tmp_path), poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ResettingProxy]:
    url = sa.make_url(database_url("pg8000", tmp_path))
    running = ResettingProxy(url.host or "127.0.0.1", url.port or 5432)
    try:
        yield running
    finally:
        running.close()


def through(proxy: ResettingProxy, tmp_path: Path) -> str:
    """The pg8000 test URL, through `proxy`."""
    url = sa.make_url(database_url("pg8000", tmp_path))
    return url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def end_pooled_backend(engine: sa.Engine, killer: sa.Engine) -> int:
    """End the server backend of `engine`'s pooled connection (pg_terminate_backend); its pid."""
    with engine.connect() as conn:
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() or 0)
    with killer.connect() as conn:  # waits up to 5 s for the backend to exit
        assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)").scalar()
    return pid


def delivery(ckit_id: str) -> Delivery:
    return Delivery(topic="ORDER_CREATED", body=b"{}", broker_message_id=f"B-{ckit_id}",
                    tags="created", keys="", properties={"ckit_id": ckit_id},
                    reconsume_times=0)


def pool_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("sqlalchemy") and r.levelno >= logging.WARNING]


def test_a_reset_met_by_the_pre_ping_is_a_new_connection_not_a_bare_socket_error(
        proxy: ResettingProxy, killer: sa.Engine, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a pg8000 engine with the pool's pre-ping, whose one pooled connection the server
    # ended, the reset reaching pg8000 on the pre-ping's read
    engine = make_engine(through(proxy, tmp_path), pool_size=1, max_overflow=0,
                         pool_pre_ping=True)
    try:
        pid = end_pooled_backend(engine, killer)
        proxy.wait_server_closed()
        # When the connection is checked out again, then the pre-ping replaces it unseen, as
        # psycopg's does (the bare ConnectionResetError came out of engine.connect())
        with caplog.at_level(logging.INFO, logger="sqlalchemy.pool"), engine.connect() as conn:
            new_pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    finally:
        engine.dispose()
    assert proxy.resets == 1 and new_pid != pid
    # and the pool says it at INFO, as for psycopg, with no error and no traceback
    assert any("Disconnection detected on checkout" in r.getMessage() for r in caplog.records)
    assert pool_errors(caplog) == []


def test_a_terminated_connection_the_pre_ping_replaces_is_no_error_in_the_log(
        killer: sa.Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a pg8000 engine with the pool's pre-ping, straight to the server, whose pooled
    # connection's backend was terminated (pg8000 sees it as its "network error")
    engine = make_engine(database_url("pg8000", tmp_path), pool_size=1, max_overflow=0,
                         pool_pre_ping=True)
    try:
        pid = end_pooled_backend(engine, killer)
        # When it is checked out again, then a new one is made, and the pool logs no ERROR
        # with a traceback for closing the dead one (pg8000's close() raised on its socket)
        with caplog.at_level(logging.INFO, logger="sqlalchemy.pool"), engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != pid
    finally:
        engine.dispose()
    assert pool_errors(caplog) == []


def test_a_consumer_with_the_pre_ping_goes_on_after_its_connection_is_reset(
        proxy: ResettingProxy, killer: sa.Engine, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given a consumer on pg8000 with the pool's pre-ping, its tables created beforehand
    tag = uuid.uuid4().hex[:8]
    names = TableNames(outbox=f"race{tag}_outbox", receipts=f"race{tag}_ack",
                       processed=f"race{tag}_processed", mq_prefix=f"race{tag}_mq")
    metadata = build_metadata(names, include_transport=False)
    direct = make_engine(database_url("pg8000", tmp_path))
    metadata.create_all(direct)
    engine = make_engine(through(proxy, tmp_path), pool_size=1, max_overflow=0,
                         pool_pre_ping=True)
    app = ConsumerApp(group=f"race-{tag}", db=engine, redis=None, receipts=None,
                      processed_table=names.processed, transport=MemoryTransport())

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        session.execute(sa.text("SELECT 1"))

    try:
        assert app.pipeline().process(delivery("M1")).outcome is Outcome.SUCCEEDED
        # When the server ends its pooled connection, the reset meeting the pre-ping
        end_pooled_backend(engine, killer)
        proxy.wait_server_closed()
        with caplog.at_level(logging.INFO):
            result = app.pipeline().process(delivery("M2"))
    finally:
        app.close()
        engine.dispose()
        metadata.drop_all(direct)
        direct.dispose()
    # Then the next message runs on a new connection: no failure laid on the handler (it was
    # "handler ... raised, reconsume later: ConnectionResetError")
    assert proxy.resets == 1
    assert result.outcome is Outcome.SUCCEEDED, result
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_close_that_fails_on_a_live_connection_still_raises(tmp_path: Path) -> None:
    # Given a pg8000 engine, whose driver's close fails with an error that is no disconnect
    engine = make_engine(database_url("pg8000", tmp_path))
    dialect = engine.dialect
    refused = dialect.loaded_dbapi.InterfaceError("close refused")

    def failing_close(_dbapi_connection: Any) -> None:
        raise refused

    close = network_errors._dead_connection_closed_quietly(dialect, failing_close)
    engine.dispose()
    # When it closes, then that error comes out: only a dead connection's close passes quietly
    with pytest.raises(type(refused), match="close refused"):
        close(object())
