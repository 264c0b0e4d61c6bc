"""What the SQL transport adds to the conformance suite: schema, locking, offsets, errors."""

from __future__ import annotations

import collections
import datetime as dt
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.errors import (
    ConfigError,
    DuplicateKey,
    MessageTooLarge,
    SchemaError,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.messages import retry_topic
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
    Verdict,
)
from consumer_kit.transports.sql import SqlTransport
from consumer_kit.transports.sql.group import GroupStore
from tests.harnesses.sql_mariadb import drop_tables, mariadb_url, unique_prefix
from tests.harnesses.sql_postgresql import postgresql_url
from tests.harnesses.sql_sqlite import sqlite_url

TIMEOUT = 10.0


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


def test_a_sqlite_file_that_is_not_there_is_refused_without_making_it(tmp_path: Path) -> None:
    # Given the SQL transport on a SQLite file that is not there (a typo in its path)
    url = f"sqlite:///{tmp_path / 'typo.db'}"
    # When a message is sent, a consumer starts or a purge runs
    for use in (lambda t: t.send(OutgoingMessage("orders", b"x")),
                lambda t: t.consumer("g", [Subscription("orders")], collect([])).start(),
                lambda t: t.purge(utcnow())):
        with SqlTransport(url) as t, pytest.raises(SchemaError) as caught:
            use(t)
        # Then each is refused, naming the file and `ckit db init`
        assert "typo.db' does not exist" in str(caught.value)
        assert "ckit db init --url" in str(caught.value)
    # and no empty file was left behind
    assert not (tmp_path / "typo.db").exists()
    # while create_tables still makes it
    with SqlTransport(url, create_tables=True) as t:
        t.send(OutgoingMessage("orders", b"x"))
    assert (tmp_path / "typo.db").exists()


def test_repr_shows_the_masked_url_and_the_table_prefix(tmp_path: Path) -> None:
    with SqlTransport("mysql+pymysql://ckit:s3cret@127.0.0.1:1/mq", table_prefix="abc") as t:
        assert repr(t) == ("SqlTransport('mysql+pymysql://ckit:***@127.0.0.1:1/mq', "
                           "table_prefix='abc')")
    with SqlTransport(sqlite_url(tmp_path)) as t:
        assert repr(t) == f"SqlTransport({sqlite_url(tmp_path)!r}, table_prefix='ckit_mq')"


def test_the_schema_error_names_a_table_prefix_other_than_the_default(tmp_path: Path) -> None:
    with SqlTransport(sqlite_url(tmp_path), table_prefix="abc") as t, \
            pytest.raises(SchemaError, match="table prefix 'abc'"):
        t.send(OutgoingMessage("orders", b"x"))


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


def test_a_duplicate_key_raises_duplicate_key_and_other_constraints_do_not(
    transport: SqlTransport,
) -> None:
    # Given a topic whose queue rows exist
    transport.ensure_topic("dup_t")
    q = transport.tables.queue
    row = {"topic": "dup_t", "queue_id": 0, "next_offset": 0, "created_at": utcnow()}

    def insert(values: dict[str, object]) -> Callable[[sa.Connection], object]:
        return lambda conn: conn.execute(sa.insert(q), [values])

    # Then inserting one again is a DuplicateKey, with the driver's error as its cause
    with pytest.raises(DuplicateKey) as caught:
        transport.db.run(insert(row), write=True, what="insert a queue twice")
    assert isinstance(caught.value.__cause__, sa.exc.IntegrityError)
    # and breaking another constraint (NOT NULL) stays a plain TransportError
    with pytest.raises(TransportError) as other:
        transport.db.run(insert({**row, "queue_id": 9, "next_offset": None}), write=True,
                         what="insert a queue without an offset")
    assert not isinstance(other.value, DuplicateKey)


def test_a_topic_another_process_creates_meanwhile_is_used_not_an_error(
    db: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two transports; the second counts no queues, then the first creates the topic
    url, prefix = db
    with SqlTransport(url, table_prefix=prefix, create_tables=True, queues=3) as first, \
            SqlTransport(url, table_prefix=prefix, queues=5) as second:
        first.check_schema()
        real_run = second.db.run
        raced: list[str] = []

        def run(work: Callable[[sa.Connection], object], *, write: bool, what: str) -> object:
            if what == "read topic queues" and not raced:
                raced.append(what)
                first.ensure_topic("race_t")
                return 0
            return real_run(work, write=write, what=what)

        monkeypatch.setattr(second.db, "run", run)
        # When the second creates its queues too, Then it uses the first's (no error)
        assert second.queue_count("race_t") == 3
        assert raced


@pytest.mark.mariadb
def test_a_message_over_the_servers_max_allowed_packet_is_refused_not_an_outage() -> None:
    # Given a MariaDB transport allowed bodies larger than the server takes in one statement
    prefix = unique_prefix()
    with SqlTransport(mariadb_url(), table_prefix=prefix, create_tables=True,
                      max_body_bytes=256 * 1024 * 1024, unavailable_after=5) as t:
        try:
            packet = int(t.db.run(lambda conn: conn.exec_driver_sql(
                "SELECT @@max_allowed_packet").scalar_one(), write=False, what="test"))
            # a body over it, and one under it that escaping (NULs: two bytes each) takes over
            for body in (b"x" * (packet + 1024), b"\0" * (packet // 2 + 1024)):
                # When it is sent
                started = time.monotonic()
                with pytest.raises(MessageTooLarge) as refused:
                    t.send(OutgoingMessage("packet_t", body))
                # Then it is refused as this message's fault, at once, naming the setting
                assert time.monotonic() - started < 2.0
                assert "max_allowed_packet" in str(refused.value)
            # and the next message goes through
            assert t.send(OutgoingMessage("packet_t", b"small")).queue_offset == 0
        finally:
            drop_tables(t)


@pytest.mark.parametrize("server", [pytest.param("mariadb", marks=pytest.mark.mariadb),
                                    pytest.param("postgresql", marks=pytest.mark.postgresql)])
def test_two_members_inserting_a_first_lease_at_once_one_wins_without_an_error(
    server: str,
) -> None:
    # READ COMMITTED lets both members see no lease row and insert one (SQLite serialises the
    # two write transactions, so only a server can race here)
    url = mariadb_url() if server == "mariadb" else postgresql_url()
    prefix = unique_prefix()
    with SqlTransport(url, table_prefix=prefix, create_tables=True) as a_side, \
            SqlTransport(url, table_prefix=prefix) as b_side:
        try:
            a_side.ensure_topic("lease_t")
            a = GroupStore(a_side.db, a_side.tables, "g", "member-a", 30)
            b = GroupStore(b_side.db, b_side.tables, "g", "member-b", 30)
            first: list[object] = []

            # Given member a commits its lease row just before member b inserts its own
            @sa.event.listens_for(b_side.db.engine, "before_cursor_execute")
            def a_goes_first(_conn: object, _cursor: object, statement: str, *_: object) -> None:
                if not first and statement.lstrip().upper().startswith("INSERT INTO") \
                        and b_side.tables.lease.name in statement:
                    first.append(a.acquire(("lease_t", 0)))

            # When b takes the lease, Then b learns that a won, and a holds it
            assert b.acquire(("lease_t", 0)) is None
            assert first and first[0] is not None
            assert b.acquire(("lease_t", 0)) is None
        finally:
            drop_tables(a_side)


def test_two_consumers_promoting_the_same_due_messages_give_each_one_offset(
    db: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 40 scheduled messages now due, in two queues
    url, prefix = db
    topic, count = "promote_t", 40
    with SqlTransport(url, table_prefix=prefix, create_tables=True, queues=2) as first, \
            SqlTransport(url, table_prefix=prefix, queues=2) as second:
        for i in range(count):
            first.send(OutgoingMessage(topic, f"p{i}".encode(), delay=0.01))
        store = GroupStore(first.db, first.tables, "g", "reader", 30)
        assert wait_for(lambda: store.count_due([topic]) == count, TIMEOUT)
        # both transports read the same due rows before either promotes them
        both_read = threading.Barrier(2, timeout=TIMEOUT)
        for side in (first, second):
            real_run = side.db.run

            def run(work: Callable[[sa.Connection], object], *, write: bool, what: str,
                    real_run: Callable[..., object] = real_run) -> object:
                result = real_run(work, write=write, what=what)
                if what == "find due messages":
                    both_read.wait()
                return result

            monkeypatch.setattr(side.db, "run", run)
        promoted: list[int] = []
        errors: list[BaseException] = []

        def promote(side: SqlTransport) -> None:
            try:
                promoted.append(side.promote_due([(topic, 0), (topic, 1)]))
            except BaseException as error:
                errors.append(error)

        # When
        threads = [threading.Thread(target=promote, args=(side,)) for side in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)

        # Then each message got one offset: every queue is gapless and matches its head
        assert errors == []
        assert len(promoted) == 2
        assert sum(promoted) == count  # per queue, one side promoted and the other found none
        m, q = first.tables.message, first.tables.queue
        stored = rows(first, sa.select(m.c.queue_id, m.c.queue_offset).where(m.c.topic == topic))
        per_queue: dict[int, list[int]] = collections.defaultdict(list)
        for queue_id, offset in stored:
            per_queue[int(queue_id)].append(int(offset))
        assert sum(len(offsets) for offsets in per_queue.values()) == count
        heads = dict(rows(first, sa.select(q.c.queue_id, q.c.next_offset)
                          .where(q.c.topic == topic)))
        assert {k: sorted(v) for k, v in per_queue.items()} == {
            k: list(range(heads[k])) for k in per_queue}


def test_a_member_promotes_its_own_due_messages_however_many_are_due_on_other_queues(
    transport: SqlTransport,
) -> None:
    # Given more due messages than one promotion takes on queue 1 (another member's, busy or
    # killed), all due before the one message due on queue 0
    topic = "promote_own_t"
    transport.ensure_topic(topic)
    past = utcnow() - dt.timedelta(seconds=60)

    def scheduled(queue_id: int, n: int, at: dt.datetime) -> dict[str, object]:
        return {"uniq_key": f"{queue_id}-{n}", "topic": topic, "queue_id": queue_id,
                "queue_offset": None, "tags": None, "keys": None, "properties": None,
                "body": b"x", "born_at": at, "deliver_at": at, "reconsume_times": 0,
                "origin_group": None, "origin_topic": None}

    others = [scheduled(1, n, past) for n in range(300)]
    mine = scheduled(0, 0, past + dt.timedelta(seconds=30))
    transport.db.run(lambda conn: transport.queue_log.schedule(conn, [*others, mine]),
                     write=True, what="test")

    # When the member owning queue 0 alone promotes
    promoted = transport.promote_due([(topic, 0)])

    # Then its message is in its queue, not held behind the other member's
    assert promoted == 1
    m = transport.tables.message
    assert rows(transport, sa.select(m.c.queue_offset).where(m.c.uniq_key == "0-0")) == [(0,)]


# -- consuming -----------------------------------------------------------------------------------


def test_a_busy_consumer_fetches_whole_batches_and_wakes_no_other_poller(
    db: tuple[str, str],
) -> None:
    # Given 200 messages in one queue, a consumer working through them (2 ms each) and an
    # idle consumer of another topic, both counting their queue-head reads and fetches
    url, prefix = db
    poll, count = 0.2, 200
    with SqlTransport(url, table_prefix=prefix, create_tables=True, poll_interval=poll,
                      batch_size=32, lease_seconds=2) as t:
        t.ensure_topic("other_t")
        for i in range(count):
            t.send(OutgoingMessage("batch_t", f"b{i}".encode(), sharding_key="one"))
        got: list[Delivery] = []

        def slow(d: Delivery) -> ConsumeStatus:
            time.sleep(0.002)
            got.append(d)
            return ConsumeStatus.CONSUME_SUCCESS

        busy = t.consumer("batch_g", [Subscription("batch_t")], slow, threads=2)
        idle = t.consumer("idle_g", [Subscription("other_t")], collect([]))
        calls: collections.Counter[str] = collections.Counter()
        for name, consumer in (("busy", busy), ("idle", idle)):
            for method in ("queues", "fetch"):
                real = getattr(consumer.store, method)

                def counted(*args: object, _real: Callable[..., object] = real,
                            _key: str = f"{name} {method}") -> object:
                    calls[_key] += 1
                    return _real(*args)

                setattr(consumer.store, method, counted)
        started = time.monotonic()
        idle.start()
        busy.start()
        try:
            # When
            assert wait_for(lambda: len(got) == count, TIMEOUT)
        finally:
            busy.shutdown()
            idle.shutdown()
        elapsed = time.monotonic() - started  # the idle one polls until its own shutdown
    # Then the busy one fetched at least 8 messages a time on average (it was 1 when every
    # finished message woke the pollers), and the idle one only read on its poll interval
    assert calls["busy fetch"] <= count // 8, calls
    assert calls["busy queues"] <= count // 8, calls
    assert calls["idle queues"] <= elapsed / poll + 5, (calls, elapsed)



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


def test_a_verdicts_reason_is_in_the_retry_copys_properties_and_the_dead_letter_row(
    transport: SqlTransport,
) -> None:
    # Given: a callback refusing every delivery with a reason naming the attempt
    topic, group = "why_t", "why_g"
    transport.ensure_topic(topic)
    seen: list[Delivery] = []

    def refuse(d: Delivery) -> Verdict:
        seen.append(d)
        return Verdict(ConsumeStatus.RECONSUME_LATER, f"sku unknown (attempt {d.reconsume_times})")

    consumer = transport.consumer(group, [Subscription(topic)], refuse)
    consumer.start()
    try:
        # When
        transport.send(OutgoingMessage(topic, b"x", properties={"ckit_id": "W1"}))
        assert wait_for(lambda: len(transport.dead_letters(group)) == 1, TIMEOUT)
    finally:
        consumer.shutdown()
    # Then: each retry row carries the previous reason in its properties JSON ...
    m = transport.tables.message
    retry_props = [r[0] for r in rows(transport, sa.select(m.c.properties)
                                      .where(m.c.topic == retry_topic(group))
                                      .order_by(m.c.reconsume_times))]
    assert retry_props == [{"ckit_id": "W1", "ckit_reason": f"sku unknown (attempt {n})"}
                           for n in range(transport.max_reconsume_times)]
    # ... which comes back as last_error, not as a property; the dead letter has the last one
    assert [(d.last_error, dict(d.properties)) for d in seen] == \
        [("", {"ckit_id": "W1"})] + [(f"sku unknown (attempt {n})", {"ckit_id": "W1"})
                                     for n in range(transport.max_reconsume_times)]
    assert {d.max_reconsume_times for d in seen} == {transport.max_reconsume_times}
    d = transport.tables.dlq
    last = f"sku unknown (attempt {transport.max_reconsume_times})"
    assert rows(transport, sa.select(d.c.reason).where(d.c.consumer_group == group)) == \
        [(last,)]
    assert transport.dead_letters(group)[0].last_error == last


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
    # a group consumed the queued message (purge deletes only what every group consumed)
    got: list[Delivery] = []
    consumer = transport.consumer("purge_g", [Subscription("purge_t", "*")], collect(got))
    consumer.start()
    assert wait_for(lambda: len(got) == 1, TIMEOUT)
    consumer.shutdown()
    assert transport.purge(dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
                           + dt.timedelta(seconds=1)).deleted == 1
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


@pytest.mark.postgresql
def test_a_postgresql_table_locked_for_too_long_is_retried_then_transport_unavailable() -> None:
    # Given a topic, and a transport whose statements give up on a lock after 50 ms (55P03)
    url, prefix = postgresql_url(), unique_prefix()
    options = {"connect_args": {"options": "-c lock_timeout=50"}}
    with SqlTransport(url, table_prefix=prefix, create_tables=True) as setup:
        setup.ensure_topic("locked")
    blocker = sa.create_engine(url).connect()
    try:
        # When another session holds the message table locked past the transport's patience
        blocker.exec_driver_sql(f"LOCK TABLE {prefix}_message IN ACCESS EXCLUSIVE MODE")
        with SqlTransport(url, table_prefix=prefix, unavailable_after=0.5,
                          engine_options=options) as t:
            started = time.monotonic()
            # Then each lock timeout is retried, and the send ends as unavailable in bounded time
            with pytest.raises(TransportUnavailable, match="unavailable"):
                t.send(OutgoingMessage("locked", b"x"))
            assert time.monotonic() - started < 5
    finally:
        blocker.rollback()
        blocker.close()
        blocker.engine.dispose()
        cleanup = SqlTransport(url, table_prefix=prefix)
        drop_tables(cleanup)
        cleanup.close()


@pytest.mark.parametrize("url", ["mysql+pymysql://ckit:s3cret@127.0.0.1:1/ckit_test",
                                 "postgresql+psycopg://ckit:s3cret@127.0.0.1:1/ckit_test"],
                         ids=["mariadb", "postgresql"])
def test_an_unreachable_server_raises_transport_unavailable_without_the_password(
    url: str,
) -> None:
    options = {"connect_args": {"connect_timeout": 1}}
    with SqlTransport(url, unavailable_after=0.3, engine_options=options) as t, \
            pytest.raises(TransportUnavailable) as caught:
        t.send(OutgoingMessage("orders", b"x"))
    assert "s3cret" not in str(caught.value)
    assert "ckit:***@127.0.0.1:1" in str(caught.value)


def test_a_member_shut_down_under_a_running_callback_keeps_the_queue_until_its_lease_runs_out(
        tmp_path: Path) -> None:
    # Given two members of a group on one queue (lease 2 s), the first running a 3 s callback
    t = SqlTransport(sqlite_url(tmp_path), create_tables=True, queues=1, lease_seconds=2,
                     poll_interval=0.02)
    runs: list[tuple[str, str, float]] = []
    lock = threading.Lock()
    started = threading.Event()

    def member(name: str) -> Callable[[Delivery], ConsumeStatus]:
        def handler(delivery: Delivery) -> ConsumeStatus:
            with lock:
                runs.append((name, "start", time.monotonic()))
            started.set()
            time.sleep(3)
            with lock:
                runs.append((name, "end", time.monotonic()))
            return ConsumeStatus.CONSUME_SUCCESS
        return handler

    first = t.consumer("G", [Subscription("T")], member("first"))
    first.start()
    t.send(OutgoingMessage("T", b"slow"))
    assert started.wait(10)
    second = t.consumer("G", [Subscription("T")], member("second"))
    second.start()
    try:
        # When the first is shut down with a timeout shorter than its callback
        first.shutdown(timeout=0.2)
        time.sleep(4)
    finally:
        second.shutdown(6)
        t.close()
    # Then the second never ran the message while the first still did: the first kept the
    # queue until its callback returned, committed it, and only then handed the queue over
    assert [(name, what) for name, what, _ in runs] == [("first", "start"), ("first", "end")]


def test_a_reason_holding_a_lone_surrogate_reaches_the_dead_letters_and_the_queue_goes_on(
    transport: SqlTransport,
) -> None:
    # Given: a callback failing with a reason no database can store as it is (a handler's error
    # quoting a body it decoded with surrogateescape), and a healthy message behind it
    topic, group = "surrogate_t", "surrogate_g"
    transport.ensure_topic(topic)
    handled: list[bytes] = []
    odd = b"caf\xe9".decode("utf-8", "surrogateescape")

    def callback(d: Delivery) -> Verdict:
        handled.append(d.body)
        if d.body == b"poison":
            return Verdict(ConsumeStatus.RECONSUME_LATER, f"ValueError: bad name {odd!s}")
        return Verdict(ConsumeStatus.CONSUME_SUCCESS)

    consumer = transport.consumer(group, [Subscription(topic)], callback, threads=1)
    consumer.start()
    try:
        # When
        transport.send(OutgoingMessage(topic, b"poison", sharding_key="q"))
        transport.send(OutgoingMessage(topic, b"healthy", sharding_key="q"))
        # Then: the poison message is a dead letter with its reason (the odd character as
        # U+FFFD), and the worker lives on to handle the message after it
        assert wait_for(lambda: len(transport.dead_letters(group)) == 1 and
                        b"healthy" in handled, TIMEOUT)
    finally:
        consumer.shutdown()
    assert transport.dead_letters(group)[0].last_error == "ValueError: bad name caf\ufffd"
