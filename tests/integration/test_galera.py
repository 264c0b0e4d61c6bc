"""A MariaDB Galera node taken out of service (`wsrep_reject_queries`), like one that left its
cluster's Primary component or is still joining, answers every statement on a table with error
1047 "WSREP has not yet prepared node for application use" until it is back. That is an outage:
the relay and the SQL transport wait it out. They used to take 1047 for a lasting error (it is
"Unknown command" elsewhere) and stop: the relay died, the transport's send failed at once.

The node is node 1 of the cluster of scripts/mariadb-galera.sh (127.0.0.1:3309). A node out of
the Primary component answers the same 1047: test_galera_cluster.py cuts node 2 off.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.schema import build_metadata
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.sql import SqlTransport
from outbox_producer import Relay
from outbox_producer import relay as relay_module
from tests import services
from tests.cli import ckit, error_line
from tests.conftest import Db, unique_names
from tests.producer.test_relay_partial import outbox_states, sql_transport
from tests.producer.test_retention import publish
from tests.recording import RecordingTransport

pytestmark = pytest.mark.mariadb

WAIT_S = 30
OUT_OF_SERVICE_S = 1.5
#: `wsrep_reject_queries` values: ALL rejects statements on the connections it has too (1047),
#: ALL_KILL also kills them (a lost connection, then 1047)
WAYS = {"rejecting queries": "ALL", "killing its connections": "ALL_KILL"}


def admin(node_url: str | None = None) -> pymysql.Connection:
    """An autocommit connection to Galera node 1 (or the node at `node_url`)."""
    url = sa.make_url(node_url or services.mysql_galera_url())
    return pymysql.connect(host=url.host, port=url.port or 3309, user=url.username,
                           password=url.password, autocommit=True, connect_timeout=5)


def wsrep_status(conn: pymysql.Connection) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN "
                    "('wsrep_cluster_status', 'wsrep_ready')")
        return {name: value for name, value in cur.fetchall()}


def wait_until_ready(conn: pymysql.Connection) -> None:
    """Wait (bounded) until the node is the Primary component and ready."""
    deadline = time.monotonic() + WAIT_S
    while True:
        status = wsrep_status(conn)
        if status == {"wsrep_cluster_status": "Primary", "wsrep_ready": "ON"}:
            return
        assert time.monotonic() < deadline, f"the Galera node stayed {status}"
        time.sleep(0.1)


@contextlib.contextmanager
def unavailable(way: str) -> Iterator[None]:
    """The node unavailable `way` for the block (asserted: the outage is real), available again
    after it."""
    conn = admin()
    try:
        wait_until_ready(conn)
        with conn.cursor() as cur:
            cur.execute(f"SET GLOBAL wsrep_reject_queries = {WAYS[way]}")
        try:
            yield
        finally:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL wsrep_reject_queries = NONE")
    finally:
        conn.close()


@contextlib.contextmanager
def unavailable_for(way: str, seconds: float) -> Iterator[threading.Thread]:
    """The node unavailable `way` from now for `seconds`, on a thread; the block runs meanwhile
    (and the thread is joined after it)."""
    ready = threading.Event()

    def outage() -> None:
        with unavailable(way):
            ready.set()
            time.sleep(seconds)

    thread = threading.Thread(target=outage, name="galera-outage")
    thread.start()
    try:
        assert ready.wait(WAIT_S), "the Galera node did not become unavailable"
        yield thread
    finally:
        thread.join(WAIT_S * 2)
        assert not thread.is_alive(), "the Galera node did not come back"


@pytest.fixture
def galera(tmp_path: Path) -> Iterator[Db]:
    """consumer-kit's tables on the Galera node, which is Primary and ready."""
    url = services.mysql_galera_url()
    # a run killed in the middle of an outage leaves the node rejecting queries, which its
    # status does not show (Primary and ready all along) and which would fail the ping below:
    # start from a node in service (a node that does not answer is the ping's to report)
    with contextlib.suppress(pymysql.err.OperationalError), contextlib.closing(admin()) as conn:
        with conn.cursor() as cur:
            cur.execute("SET GLOBAL wsrep_reject_queries = NONE")
        wait_until_ready(conn)
    services.require("mariadb galera", lambda: services.ping_mysql(url))
    engine = make_engine(url)
    names = unique_names("g")
    metadata = build_metadata(names, include_transport=True)
    metadata.create_all(engine)
    try:
        yield Db(engine, names, "mariadb", url)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


@pytest.mark.parametrize("way", list(WAYS))
def test_the_test_node_answers_1047_while_out_of_service(galera: Db, way: str) -> None:
    # The outage the tests below make is the one they claim: a statement on a table fails
    # with 1047 while the node rejects queries
    with unavailable(way), \
            pytest.raises(sa.exc.OperationalError) as caught, galera.engine.connect() as conn:
        conn.execute(sa.text(f"SELECT COUNT(*) FROM {galera.names.outbox}"))
    assert caught.value.orig.args[0] == 1047  # type: ignore[union-attr]
    assert "WSREP" in str(caught.value.orig)


@pytest.mark.parametrize("way", list(WAYS))
def test_the_relay_waits_out_a_galera_node_out_of_service(
        galera: Db, way: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Given due rows on a Galera node that becomes unavailable just before the relay runs
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.1, 0.2))
    ids = publish(galera, range(20))
    transport = RecordingTransport()
    with unavailable_for(way, OUT_OF_SERVICE_S):
        # When the relay drains them, then it waits out the node's 1047s and sends each once
        result = Relay(galera.engine, transport, table=galera.names.outbox).run_once()
    assert result.errors >= 1 and result.gave_up is None
    # (one line per wait, naming the driver's error)
    assert "database error: OperationalError: (1047, 'WSREP has not yet prepared node" in \
        caplog.text
    assert transport.counts() == {m: 1 for m in ids}
    assert set(outbox_states(galera.engine, galera.names.outbox).values()) == {OutboxState.SENT}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_sql_transport_waits_out_a_galera_node_out_of_service(galera: Db, way: str) -> None:
    # Given the SQL transport's tables on the Galera node
    prefix = galera.names.mq_prefix
    with SqlTransport(galera.url, table_prefix=prefix, unavailable_after=WAIT_S) as transport:
        transport.send(OutgoingMessage("orders", b"before"))
        # When the node goes out of service as the transport sends, then the send waits it out
        with unavailable_for(way, OUT_OF_SERVICE_S):
            started = time.monotonic()
            transport.send(OutgoingMessage("orders", b"during"))
            waited = time.monotonic() - started
    assert waited >= 0.5  # it did meet the outage
    assert galera.count(f"{prefix}_message") == 2


def test_ckit_relay_claim_lock_on_a_galera_node_fails_before_any_row_moves(
        galera: Db, tmp_path: Path) -> None:
    # Given due rows on a Galera node: its row locks would not stop a relay on another node,
    # which would send the same rows
    ids = publish(galera, range(2))
    # When a relay is started with --claim lock, then it refuses with one line, moving nothing
    result = ckit("relay", "--url", galera.url, "--transport", sql_transport(tmp_path),
                  "--once", "--outbox-table", galera.names.outbox, "--claim", "lock")
    assert result.returncode == 2
    assert "a Galera node keeps to itself" in error_line(result.stderr)
    assert "use --claim lease" in error_line(result.stderr)
    assert outbox_states(galera.engine, galera.names.outbox) == {
        m: OutboxState.PENDING for m in ids}
