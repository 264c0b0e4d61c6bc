"""What the SQL transport adds to the conformance suite: schema, locking, offsets, errors."""

from __future__ import annotations

import collections
import datetime as dt
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.errors import ConfigError, SchemaError, TransportUnavailable
from consumer_kit.schema import TableNames, build_metadata
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.base import retry_topic
from consumer_kit.transports.sql import SqlTransport
from tests.harnesses.base import wait_for
from tests.harnesses.sql_mariadb import drop_tables, mariadb_url, unique_prefix
from tests.harnesses.sql_sqlite import FAST_OPTIONS, sqlite_url

TIMEOUT = 10.0


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(database URL, a table prefix of this test's own); tables dropped afterwards."""
    if request.param == "sqlite":
        url, prefix = sqlite_url(tmp_path), "ckit_mq"
    else:
        url, prefix = mariadb_url(), unique_prefix()
    yield url, prefix
    if request.param == "mariadb":
        cleanup = SqlTransport(url, table_prefix=prefix)
        drop_tables(cleanup)
        cleanup.close()


@pytest.fixture
def transport(db: tuple[str, str]) -> Iterator[SqlTransport]:
    url, prefix = db
    t = SqlTransport(url, table_prefix=prefix, **FAST_OPTIONS)
    yield t
    t.close()


def collect(into: list[Delivery]) -> Callable[[Delivery], ConsumeStatus]:
    """A callback appending each delivery to `into`."""
    def callback(delivery: Delivery) -> ConsumeStatus:
        into.append(delivery)
        return ConsumeStatus.CONSUME_SUCCESS
    return callback


def rows(t: SqlTransport, stmt: sa.Executable) -> list[sa.Row[tuple[object, ...]]]:
    return list(t.db.run(lambda conn: conn.execute(stmt).all(), write=False, what="test"))


# -- schema and configuration --------------------------------------------------------------------


def test_missing_tables_raise_a_schema_error_naming_ckit_db_init(db: tuple[str, str]) -> None:
    url, prefix = db
    with SqlTransport(url, table_prefix=prefix) as t, pytest.raises(SchemaError) as caught:
        t.send(OutgoingMessage("orders", b"x"))
    text = str(caught.value)
    assert "ckit db init --url" in text
    assert ":ckit@" not in text  # the MariaDB password is masked
    if url.startswith("mysql"):
        assert ":***@" in text


def test_create_tables_makes_the_six_tables_and_db_init_knows_them(db: tuple[str, str]) -> None:
    url, prefix = db
    with SqlTransport(url, table_prefix=prefix, create_tables=True) as t:
        t.check_schema()
        names = set(sa.inspect(t.db.engine).get_table_names())
    suffixes = ("message", "queue", "offset", "queue_lease", "member", "dlq")
    assert {f"{prefix}_{s}" for s in suffixes} <= names
    assert {f"ckit_mq_{s}" for s in suffixes} <= set(build_metadata(TableNames()).tables)


def test_open_transport_builds_it_from_a_sql_plus_url(tmp_path: Path) -> None:
    from consumer_kit.transports import open_transport

    with open_transport(f"sql+{sqlite_url(tmp_path)}", create_tables=True) as t:
        assert t.scheme == "sql"
        assert t.send(OutgoingMessage("open", b"x")).queue_offset == 0


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "nonsense:::",
                                 "sqlite:////no/such/folder/mq.db"])
def test_unusable_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        SqlTransport(url)


@pytest.mark.parametrize("prefix", ["bad-name", "x" * 41, "1abc"])
def test_bad_table_prefixes_are_config_errors(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(ConfigError):
        SqlTransport(sqlite_url(tmp_path), table_prefix=prefix)


# -- sending -------------------------------------------------------------------------------------


def test_concurrent_senders_get_gapless_offsets_per_queue(transport: SqlTransport) -> None:
    # Given
    topic = "conc_offsets"
    transport.ensure_topic(topic)
    results = []
    lock = threading.Lock()

    def sender(n: int) -> None:
        for i in range(40):
            result = transport.send(OutgoingMessage(topic, f"{n}-{i}".encode()))
            with lock:
                results.append(result)

    # When
    threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then every queue holds offsets 0..n-1 exactly, matching the send results
    m = transport.tables.message
    stored = rows(transport, sa.select(m.c.queue_id, m.c.queue_offset).where(m.c.topic == topic))
    per_queue: dict[int, list[int]] = collections.defaultdict(list)
    for queue_id, offset in stored:
        per_queue[int(queue_id)].append(int(offset))
    assert len(stored) == 240
    assert all(sorted(offs) == list(range(len(offs))) for offs in per_queue.values())
    assert sorted((r.queue_id, r.queue_offset) for r in results) == sorted(
        (q, o) for q, offs in per_queue.items() for o in offs)


def test_a_sharding_key_always_picks_the_same_queue(transport: SqlTransport) -> None:
    queues = {transport.send(OutgoingMessage("shard", b"x", sharding_key="order-42")).queue_id
              for _ in range(8)}
    assert len(queues) == 1


def test_a_delayed_message_waits_without_an_offset(transport: SqlTransport) -> None:
    result = transport.send(OutgoingMessage("delayed", b"x", delay=30))
    assert result.queue_offset is None
    m = transport.tables.message
    (row,) = rows(transport, sa.select(m.c.queue_offset, m.c.deliver_at, m.c.born_at)
                  .where(m.c.uniq_key == result.broker_message_id))
    assert row.queue_offset is None
    assert row.deliver_at - row.born_at >= dt.timedelta(seconds=29)


# -- consuming -----------------------------------------------------------------------------------


def test_ready_counts_deliverable_messages_until_drained(transport: SqlTransport) -> None:
    # Given five messages, one filtered out by tag, and one delayed far into the future
    topic, group = "ready_t", "ready_g"
    transport.ensure_topic(topic)
    for i in range(5):
        transport.send(OutgoingMessage(topic, f"r{i}".encode(), tags="A"))
    transport.send(OutgoingMessage(topic, b"other", tags="B"))
    transport.send(OutgoingMessage(topic, b"later", tags="A", delay=60))
    got: list[Delivery] = []
    consumer = transport.consumer(group, [Subscription(topic, "A")],
                                  collect(got),
                                  threads=2)
    # Then: counted before start (the filtered one too: an over-estimate), drained after
    assert consumer.ready() == 6
    consumer.start()
    try:
        assert wait_for(lambda: consumer.ready() == 0 and consumer.in_flight == 0, TIMEOUT)
        assert sorted(d.body for d in got) == [f"r{i}".encode() for i in range(5)]
    finally:
        consumer.shutdown()


def test_filtered_messages_still_move_the_committed_offset(transport: SqlTransport) -> None:
    topic, group = "filter_t", "filter_g"
    transport.ensure_topic(topic)
    for tag in ("A", "B", "B", "A", "B"):
        transport.send(OutgoingMessage(topic, tag.encode(), tags=tag, sharding_key="one"))
    got: list[Delivery] = []
    consumer = transport.consumer(group, [Subscription(topic, "A")],
                                  collect(got))
    consumer.start()
    assert wait_for(lambda: len(got) == 2, TIMEOUT)
    consumer.shutdown()
    off = transport.tables.offset
    committed = rows(transport, sa.select(off.c.committed_offset)
                     .where(off.c.consumer_group == group, off.c.topic == topic))
    assert max(int(r.committed_offset) for r in committed) == 5


def test_a_retry_copy_goes_to_the_group_retry_topic_and_only_that_group_sees_it(
    transport: SqlTransport,
) -> None:
    # Given two groups; the first answers RECONSUME_LATER once
    topic = "retry_t"
    transport.ensure_topic(topic)
    first: list[Delivery] = []
    second: list[Delivery] = []

    def once_later(d: Delivery) -> ConsumeStatus:
        first.append(d)
        return ConsumeStatus.RECONSUME_LATER if d.reconsume_times == 0 else \
            ConsumeStatus.CONSUME_SUCCESS

    consumers = [transport.consumer("retry_g1", [Subscription(topic)], once_later),
                 transport.consumer("retry_g2", [Subscription(topic)],
                                    collect(second))]
    for c in consumers:
        c.start()
    try:
        # When
        sent = transport.send(OutgoingMessage(topic, b"r"))
        # Then
        assert wait_for(lambda: len(first) == 2 and len(second) == 1, TIMEOUT)
        time.sleep(0.3)
        assert len(second) == 1
        assert {d.broker_message_id for d in first + second} == {sent.broker_message_id}
        m = transport.tables.message
        copies = rows(transport, sa.select(m.c.topic, m.c.origin_group, m.c.origin_topic,
                                           m.c.reconsume_times)
                      .where(m.c.uniq_key == sent.broker_message_id, m.c.origin_group.is_not(None)))
        assert [tuple(r) for r in copies] == [(retry_topic("retry_g1"), "retry_g1", topic, 1)]
    finally:
        for c in consumers:
            c.shutdown()


def test_dead_letters_keep_the_message_the_reason_and_the_count(transport: SqlTransport) -> None:
    topic, group = "dlq_t", "dlq_g"
    transport.ensure_topic(topic)

    def fail(_d: Delivery) -> ConsumeStatus:
        raise ValueError("bad payload")

    consumer = transport.consumer(group, [Subscription(topic)], fail)
    consumer.start()
    try:
        sent = transport.send(OutgoingMessage(topic, b"poison", tags="T", keys=("k1",),
                                              properties={"ckit_id": "D1"}))
        assert wait_for(lambda: len(transport.dead_letters(group)) == 1, TIMEOUT)
    finally:
        consumer.shutdown()
    (dead,) = transport.dead_letters(group)
    assert (dead.body, dead.tags, dead.keys, dead.properties["ckit_id"], dead.topic) == (
        b"poison", "T", "k1", "D1", topic)
    assert dead.broker_message_id == sent.broker_message_id
    assert dead.reconsume_times == transport.max_reconsume_times
    d = transport.tables.dlq
    (reason,) = rows(transport, sa.select(d.c.reason).where(d.c.consumer_group == group))
    assert "ValueError: bad payload" in reason[0]


def test_a_second_member_takes_half_the_queues_without_duplicates(transport: SqlTransport) -> None:
    # Given one member working, then a second joining while messages keep coming
    topic, group = "handover_t", "handover_g"
    transport.ensure_topic(topic)
    got: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def tagged(tag: int) -> Callable[[Delivery], ConsumeStatus]:
        def callback(d: Delivery) -> ConsumeStatus:
            with lock:
                got.append((tag, d.body))
            return ConsumeStatus.CONSUME_SUCCESS
        return callback

    a = transport.consumer(group, [Subscription(topic)], tagged(1))
    b = transport.consumer(group, [Subscription(topic)], tagged(2))
    a.start()
    try:
        for i in range(150):
            if i == 20:
                b.start()
            transport.send(OutgoingMessage(topic, f"h{i}".encode()))
            time.sleep(0.01)
        assert wait_for(lambda: len(got) >= 150, TIMEOUT)
        time.sleep(0.5)
        # Then each message once, and both members worked
        assert collections.Counter(body for _, body in got).most_common(1)[0][1] == 1
        assert {tag for tag, _ in got} == {1, 2}
    finally:
        a.shutdown()
        b.shutdown()


def test_purge_deletes_old_queued_messages_only(transport: SqlTransport) -> None:
    transport.send(OutgoingMessage("purge_t", b"old"))
    transport.send(OutgoingMessage("purge_t", b"scheduled", delay=60))
    assert transport.purge(dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
                           + dt.timedelta(seconds=1)) == 1
    m = transport.tables.message
    assert [bytes(r.body) for r in rows(transport, sa.select(m.c.body))] == [b"scheduled"]


# -- unavailability ------------------------------------------------------------------------------


def test_a_sqlite_file_locked_for_too_long_raises_transport_unavailable(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    with SqlTransport(url, create_tables=True) as setup:
        setup.ensure_topic("locked")
    blocker = sqlite3.connect(str(tmp_path / "ckit-mq.db"), isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with SqlTransport(url, busy_timeout=0.05, unavailable_after=0.5) as t:
            started = time.monotonic()
            with pytest.raises(TransportUnavailable, match="unavailable"):
                t.send(OutgoingMessage("locked", b"x"))
            assert time.monotonic() - started < 5
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def test_an_unreachable_server_raises_transport_unavailable_without_the_password() -> None:
    url = "mysql+pymysql://ckit:s3cret@127.0.0.1:1/ckit_test"
    options = {"connect_args": {"connect_timeout": 1}}
    with SqlTransport(url, unavailable_after=0.3, engine_options=options) as t, \
            pytest.raises(TransportUnavailable) as caught:
        t.send(OutgoingMessage("orders", b"x"))
    assert "s3cret" not in str(caught.value)
    assert "ckit:***@127.0.0.1:1" in str(caught.value)
