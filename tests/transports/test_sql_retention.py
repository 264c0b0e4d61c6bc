"""`ckit mq purge`: the SQL transport deletes only old messages that every group consumed, and
refuses windows under its safety floor unless forced (issue 11, class 5); SQLite and MariaDB."""

from __future__ import annotations

import datetime as dt
import threading

import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.cli.runtime import EXIT_FAILURE
from consumer_kit.core.clock import utcnow
from consumer_kit.core.messages import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports.sql import SqlTransport
from consumer_kit.transports.sql.retention import PURGE_FLOOR
from tests.cli import error_line
from tests.poison import POISON, refused

TIMEOUT = 20.0


def bodies(t: SqlTransport, topic: str) -> list[bytes]:
    m = t.tables.message
    found = t.db.run(lambda conn: conn.execute(
        sa.select(m.c.body).where(m.c.topic == topic).order_by(m.c.queue_offset)).scalars().all(),
        write=False, what="test")
    return [bytes(b) for b in found]


def committed(t: SqlTransport, group: str, topic: str) -> int:
    off = t.tables.offset
    value = t.db.run(lambda conn: conn.execute(
        sa.select(sa.func.max(off.c.committed_offset)).where(
            off.c.consumer_group == group, off.c.topic == topic)).scalar(),
        write=False, what="test")
    return int(value or 0)


def test_purge_deletes_only_what_every_group_consumed_and_keeps_the_lagging_groups_part(
        transport: SqlTransport) -> None:
    # Given four messages in one queue, a group that consumed all of them and a group stuck on
    # the third (its handler is still running)
    topic = "retention_t"
    transport.ensure_topic(topic)
    for n in range(4):
        transport.send(OutgoingMessage(topic, f"m{n}".encode(), sharding_key="one"))
    fast_done: list[bytes] = []
    release = threading.Event()

    def fast(delivery: Delivery) -> ConsumeStatus:
        fast_done.append(delivery.body)
        return ConsumeStatus.CONSUME_SUCCESS

    def slow(delivery: Delivery) -> ConsumeStatus:
        if delivery.body == b"m2":
            release.wait(TIMEOUT)
        return ConsumeStatus.CONSUME_SUCCESS

    consumers = [transport.consumer(group, [Subscription(topic, "*")], callback)
                 for group, callback in (("fast", fast), ("slow", slow))]
    for consumer in consumers:
        consumer.start()
    try:
        assert wait_for(lambda: committed(transport, "fast", topic) == 4, TIMEOUT)
        assert wait_for(lambda: committed(transport, "slow", topic) == 2, TIMEOUT)
        # When the retention runs past every message
        first = transport.purge(utcnow() + dt.timedelta(seconds=1))
        # Then only what both groups consumed is gone
        assert (first.deleted, first.kept, first.behind) == (2, {topic: 2}, {topic: ["slow"]})
        assert bodies(transport, topic) == [b"m2", b"m3"]
        # And once the slow group has caught up, the rest goes too
        release.set()
        assert wait_for(lambda: committed(transport, "slow", topic) == 4, TIMEOUT)
        second = transport.purge(utcnow() + dt.timedelta(seconds=1))
        assert (second.deleted, second.kept) == (2, {})
        assert bodies(transport, topic) == []
    finally:
        release.set()
        for consumer in consumers:
            consumer.shutdown()


def test_purge_keeps_every_message_of_a_topic_no_group_consumes_yet(
        transport: SqlTransport) -> None:
    # Given messages nobody has subscribed to yet, and messages younger than the horizon
    transport.send(OutgoingMessage("lonely_t", b"waiting"))
    # When
    result = transport.purge(utcnow() + dt.timedelta(seconds=1))
    # Then
    assert (result.deleted, result.kept, result.unconsumed_topics) == (
        0, {"lonely_t": 1}, ["lonely_t"])
    assert bodies(transport, "lonely_t") == [b"waiting"]


def test_the_cli_refuses_a_window_under_the_safety_floor_unless_forced(
        transport: SqlTransport, db: tuple[str, str]) -> None:
    url, prefix = db
    transport.send(OutgoingMessage("floor_t", b"x"))
    runner = CliRunner()
    base = ["mq", "purge", "--transport", f"sql+{url}", "--mq-prefix", prefix]
    # A window under the floor is refused, naming the floor and --force
    for window in ("0s", "59m"):
        refused = runner.invoke(app, [*base, "--older-than", window])
        assert refused.exit_code == 2
        line = error_line(refused.output)
        assert "--older-than" in line and "1h" in line and "--force" in line
    assert dt.timedelta(hours=1) == PURGE_FLOOR
    # With --force it runs, and says why it kept the unconsumed message
    forced = runner.invoke(app, [*base, "--older-than", "0s", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "deleted 0 messages" in forced.output
    assert "kept 1 of topic floor_t: no group consumes it yet" in forced.output
    assert bodies(transport, "floor_t") == [b"x"]


def test_a_cli_purge_failing_part_way_says_how_many_it_deleted_and_exits_1(
        transport: SqlTransport, db: tuple[str, str]) -> None:
    # Given three messages one group consumed, purged one per batch, and the database refusing
    # to delete the second
    url, prefix = db
    topic = "partial_t"
    transport.ensure_topic(topic)
    for n in range(3):
        transport.send(OutgoingMessage(topic, f"p{n}".encode(), sharding_key="one"))
    consumer = transport.consumer("only", [Subscription(topic, "*")],
                                  lambda _d: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    try:
        assert wait_for(lambda: committed(transport, "only", topic) == 3, TIMEOUT)
    finally:
        consumer.shutdown()
    engine = transport.db.engine
    m = transport.tables.message
    with engine.connect() as conn:
        second = str(conn.execute(sa.select(m.c.id).where(m.c.topic == topic)
                                  .order_by(m.c.queue_offset)).scalars().all()[1])
    with refused(engine, m.name, "DELETE", "id", second):
        # When the purge runs
        result = CliRunner().invoke(app, [
            "mq", "purge", "--transport", f"sql+{url}", "--mq-prefix", prefix,
            "--older-than", "0s", "--force", "--batch", "1"])
    # Then the first message stays deleted, the line says so, and it exits 1, not 2
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert POISON in line and "after 1 message deleted: that stays committed" in line
    assert bodies(transport, topic) == [b"p1", b"p2"]
