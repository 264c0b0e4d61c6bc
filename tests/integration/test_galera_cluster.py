"""Relays on the two nodes of a Galera cluster (scripts/mariadb-galera.sh: node 1 on
127.0.0.1:3309 weighs 2 in the quorum, node 2 on 127.0.0.1:3310 weighs 1).

- Node 2 cut off from node 1 (`gmcast.isolate`) leaves the Primary component and answers every
  statement on a table with 1047 until it has rejoined: a relay on it waits that out.
- A relay on each node claims the same due rows at the same moment. Row locks and SKIP LOCKED
  hold on one node only; what keeps the two apart is the certification of the claim's commit:
  the second claim of a row fails to commit (1213, a deadlock to the client), so its relay
  never sends it, and claims again at once. `--claim lease` commits its claim before it
  sends; this is why `--claim lock` is refused on a Galera node (test_galera.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Outcome
from consumer_kit.core.db import causal_reads, make_engine
from consumer_kit.core.schema import build_metadata, outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Relay, RelayResult, metrics
from outbox_producer import relay as relay_module
from tests import services
from tests.conftest import Db, unique_names
from tests.consumer.conftest import delivery
from tests.integration.test_galera import WAIT_S, admin, wait_until_ready
from tests.producer.test_retention import publish
from tests.recording import RecordingTransport

pytestmark = pytest.mark.mariadb

CUT_OFF_S = 1.5


def status(conn: pymysql.Connection, *names: str) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN %s", (names,))
        return {name: value for name, value in cur.fetchall()}


def wait_for(conn: pymysql.Connection, what: str, wanted: dict[str, str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while (seen := status(conn, *wanted)) != wanted:
        assert time.monotonic() < deadline, f"Galera node 2 did not become {what}: {seen}"
        time.sleep(0.05)


JOINED = {"wsrep_cluster_status": "Primary", "wsrep_ready": "ON", "wsrep_cluster_size": "2",
          "wsrep_local_state_comment": "Synced"}


def isolate(conn: pymysql.Connection, on: bool) -> None:
    with conn.cursor() as cur:
        cur.execute(f"SET GLOBAL wsrep_provider_options = 'gmcast.isolate={int(on)}'")


@contextlib.contextmanager
def cut_off_for(seconds: float) -> Iterator[None]:
    """Node 2 cut off from node 1 (asserted: out of the Primary component) from now for
    `seconds`, on a thread; the block runs meanwhile. Node 2 has rejoined when it ends."""
    ready = threading.Event()
    conn = admin(services.mysql_galera_url2())

    def outage() -> None:
        isolate(conn, True)
        try:
            wait_for(conn, "cut off", {"wsrep_cluster_status": "non-Primary"})
            ready.set()
            time.sleep(seconds)
        finally:
            isolate(conn, False)

    thread = threading.Thread(target=outage, name="galera-cut-off")
    thread.start()
    try:
        assert ready.wait(WAIT_S), "Galera node 2 was not cut off"
        yield
    finally:
        thread.join(WAIT_S * 2)
        assert not thread.is_alive(), "Galera node 2 stayed cut off"
        with contextlib.closing(conn):
            wait_for(conn, "joined again", JOINED)


@pytest.fixture
def cluster() -> Iterator[tuple[Db, Db]]:
    """consumer-kit's tables on the cluster, through node 1 and through node 2, both in the
    Primary component and synced."""
    url1, url2 = services.mysql_galera_url(), services.mysql_galera_url2()
    # a run killed part way may have left node 2 cut off or node 1 rejecting queries
    with contextlib.suppress(pymysql.err.OperationalError):
        with contextlib.closing(admin(url1)) as conn:
            with conn.cursor() as cur:
                cur.execute("SET GLOBAL wsrep_reject_queries = NONE")
            wait_until_ready(conn)
        with contextlib.closing(admin(url2)) as conn:
            isolate(conn, False)
            wait_for(conn, "joined", JOINED)
    services.require("mariadb galera", lambda: services.ping_mysql(url1))
    services.require("mariadb galera node 2", lambda: services.ping_mysql(url2))
    engines = [make_engine(url) for url in (url1, url2)]
    names = unique_names("g")
    metadata = build_metadata(names, include_transport=True)
    metadata.create_all(engines[0])
    try:
        yield Db(engines[0], names, "mariadb", url1), Db(engines[1], names, "mariadb", url2)
    finally:
        metadata.drop_all(engines[0])
        for engine in engines:
            engine.dispose()


def states(db: Db) -> Counter[OutboxState]:
    """The outbox rows' states on `db`'s node once it has applied what the cluster committed
    (a commit on the other node is applied here a moment later)."""
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn, causal_reads(conn):
        return Counter(OutboxState(s) for s in conn.execute(sa.select(t.c.state)).scalars())


def conflicts(db: Db) -> int:
    """Transactions the node's certification has failed or aborted so far."""
    url = db.engine.url
    with contextlib.closing(admin(url.render_as_string(hide_password=False))) as conn:
        seen = status(conn, "wsrep_local_cert_failures", "wsrep_local_bf_aborts")
    return sum(int(v) for v in seen.values())


def test_a_relay_on_a_node_cut_off_from_the_primary_component_waits_until_it_rejoins(
        cluster: tuple[Db, Db], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.1, 0.2))
    node1, node2 = cluster
    # Given due rows, and node 2 cut off from node 1 just before a relay on node 2 runs
    ids = publish(node2, range(20))
    transport = RecordingTransport()
    with cut_off_for(CUT_OFF_S):
        # When the relay drains them, then it waits out node 2's 1047s and sends each once
        result = Relay(node2.engine, transport, table=node2.names.outbox).run_once()
    assert result.errors >= 1 and result.gave_up is None
    assert "database error: OperationalError: (1047, 'WSREP has not yet prepared node" in \
        caplog.text
    assert transport.counts() == {m: 1 for m in ids}
    # (and the cluster has them sent: node 1 sees node 2's marks)
    assert states(node1) == {OutboxState.SENT: len(ids)}


ROWS = 300
ROUNDS = 5


def test_relays_on_two_nodes_send_each_row_once_kept_apart_by_the_certification(
        cluster: tuple[Db, Db], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.01, 0.05))
    node1, node2 = cluster
    transport = RecordingTransport()
    ids: list[str] = []
    before = conflicts(node1) + conflicts(node2)
    lost_before = metrics.CLAIMS_LOST._value.get()
    results: list[RelayResult] = []
    # Given due rows, a relay on each node claiming them in small batches at the same moment
    # (again with more rows until a claim has met the other node's: bounded)
    for round_ in range(ROUNDS):
        ids += publish(node1, range(round_ * ROWS, (round_ + 1) * ROWS))
        assert states(node2)[OutboxState.PENDING] == ROWS  # (and the last rounds' SENT)
        start = threading.Barrier(2)

        def drain(db: Db, start: threading.Barrier) -> None:
            relay = Relay(db.engine, transport, table=db.names.outbox, batch=10)
            start.wait(WAIT_S)
            results.append(relay.run_once())

        threads = [threading.Thread(target=drain, args=(db, start)) for db in cluster]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 4)
        assert not any(thread.is_alive() for thread in threads)
        if conflicts(node1) + conflicts(node2) > before:
            break
    # Then the certification failed claims of one node's relay (the rows the other claimed),
    # which claimed again; each row was sent once in all, and the cluster has every row sent
    assert conflicts(node1) + conflicts(node2) > before, \
        f"no claim met the other node's in {ROUNDS} rounds"
    lost = metrics.CLAIMS_LOST._value.get() - lost_before
    # (claimed again: a lost claim waited out as an outage counts as an error too)
    assert sum(r.errors for r in results) < lost
    assert all(r.gave_up is None for r in results)
    assert transport.counts() == {m: 1 for m in ids}
    assert states(node1) == states(node2) == {OutboxState.SENT: len(ids)}


def test_two_consumers_on_two_nodes_racing_one_message_apply_it_once(
        cluster: tuple[Db, Db], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer_kit.handling")
    node1 = cluster[0]
    stock = sa.Table(f"stock_{node1.names.outbox[:9]}", sa.MetaData(),
                     sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                     sa.Column("sku", sa.String(32), nullable=False))
    stock.create(node1.engine)
    try:
        # Given a consumer of one group on each node, database only: row locks do not reach
        # across nodes, so both insert the processed row and run the handler at once
        both_inside = threading.Barrier(2, timeout=WAIT_S)
        apps = [ConsumerApp(group="inventory", db=db.engine, redis=None, receipts=None,
                            transport=MemoryTransport(), processed_table=db.names.processed)
                for db in cluster]
        for app in apps:
            @app.listener("ORDER_CREATED")
            def reserve(msg: Message, session: Any) -> None:
                session.execute(sa.insert(stock).values(sku=msg.json()["sku"]))
                both_inside.wait()

        outcomes: list[Outcome] = []

        def deliver(app: ConsumerApp) -> None:
            outcomes.append(app.pipeline().process(delivery("SAME")).outcome)

        threads = [threading.Thread(target=deliver, args=(app,)) for app in apps]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 2)
        # When both deliveries end, then the certification let one commit; the other's
        # processed row and handler's write were rolled back together, and it is a duplicate
        # of the one that won (acked now: no redelivery needed, no warning)
        assert sorted(o.value for o in outcomes) == ["duplicate", "succeeded"]
        assert "recorded by a concurrent delivery, whose transaction won over this one's " \
            "(OperationalError: (1213, 'Deadlock found" in caplog.text
        assert "reconsume later" not in caplog.text
        # and a redelivery of it, to either node, is a duplicate
        for app in apps:
            assert app.pipeline().process(delivery("SAME", reconsume=1)).outcome is \
                Outcome.DUPLICATE
        with node1.engine.connect() as conn, causal_reads(conn):
            assert conn.execute(sa.select(sa.func.count()).select_from(stock)).scalar() == 1
    finally:
        stock.drop(node1.engine)


def test_causal_reads_wait_for_the_node_and_put_the_sessions_own_setting_back(
        cluster: tuple[Db, Db]) -> None:
    node2 = cluster[1]
    with node2.engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 2")
        conn.rollback()
        with causal_reads(conn):
            inside = conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar()
            conn.rollback()
        after = conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar()
    assert (inside, after) == (1, 2)
