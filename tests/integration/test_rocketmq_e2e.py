"""End to end over a real RocketMQ broker: outbox -> relay -> RocketMQ -> decorated consumer ->
ack topic -> `ckit acks` -> CONSUMED, and the ways that path bends (retry, reject, DLQ,
re-sends, a consumer killed mid-handler).

Needs the broker of scripts/rocketmq.sh (eighteen `1s` delay levels); the databases are SQLite
(+ fakeredis) and real MariaDB (+ real Redis).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Reject
from consumer_kit.core.states import OutboxState
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery
from consumer_kit.transports.rocketmq import RocketMQTransport
from outbox_producer import Outbox, Relay
from tests import services
from tests.consumer.conftest import Env, _env, add_reservation

pytestmark = [pytest.mark.rocketmq, pytest.mark.slow]

DELAY_LEVELS = (1.0,) * 18  # the test broker's messageDelayLevel
MAX_RECONSUME = 2
TIMEOUT = 45.0
QUIET = 2.0


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=[pytest.mark.mariadb,
                                                                 pytest.mark.redis])])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    services.require("rocketmq", services.ping_rocketmq)
    yield from _env(request.param, tmp_path)


class World:
    """One test's producer service, topic, consumer group and transports."""

    def __init__(self, env: Env, tmp_path: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.env = env
        self.tmp_path = tmp_path
        self.addr = services.rocketmq_addr()
        self.producer = f"orders-{tag}"
        self.topic = f"E2E_ORDER_{tag}"
        self.group = f"inventory-{tag}"
        self.transports: list[RocketMQTransport] = []
        self.outbox = Outbox(env.db.engine, producer=self.producer, table=env.db.names.outbox)
        self.transport().ensure_topic(self.topic)

    def transport(self) -> RocketMQTransport:
        t = RocketMQTransport(self.addr, producer_group=f"{self.producer}-tx",
                              delay_levels=DELAY_LEVELS, max_reconsume_times=MAX_RECONSUME,
                              client_log_dir=str(self.tmp_path / "rocketmq-cpp"))
        self.transports.append(t)
        return t

    def publish(self, *payloads: dict[str, Any]) -> list[str]:
        with self.env.db.engine.begin() as conn:
            return [self.outbox.publish(conn, self.topic, p, biz_type="order",
                                        biz_key=f"{i}-{uuid.uuid4().hex[:6]}")
                    for i, p in enumerate(payloads)]

    def relay(self) -> None:
        result = Relay(self.env.db.engine, self.transport(), table=self.env.db.names.outbox,
                       owner=f"relay-{self.producer}").run_once()
        assert result.errors == 0

    def app(self, **kwargs: Any) -> ConsumerApp:
        kwargs.setdefault("receipts", "topic")
        return ConsumerApp(group=self.group, db=self.env.db.engine, redis=self.env.redis,
                           processed_table=self.env.db.names.processed,
                           transport=self.transport(), threads=2, **kwargs)

    def state(self, message_id: str) -> tuple[int, str | None]:
        with self.env.db.engine.connect() as conn:
            row = conn.execute(sa.text(
                f"SELECT state, fail_reason FROM {self.env.db.names.outbox} "
                "WHERE message_id = :m"), {"m": message_id}).one()
        return int(row[0]), row[1]

    def ckit_acks_until(self, message_id: str, state: OutboxState) -> dict[str, int]:
        """Run `ckit acks --burst` (a real process) until the row reaches `state`."""
        names = self.env.db.names
        totals: dict[str, int] = {}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            proc = subprocess.run(
                [sys.executable, "-m", "consumer_kit.cli.main", "acks", "--url", self.env.db.url,
                 "--transport", f"rocketmq://{self.addr}", "--producer", self.producer,
                 "--outbox-table", names.outbox, "--receipt-table", names.receipts, "--burst",
                 "--json"],
                capture_output=True, text=True, timeout=TIMEOUT, check=False,
                env={**os.environ, "HOME": str(self.tmp_path)},  # the C++ client logs to ~/logs
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            for key, value in json.loads(proc.stdout).items():
                totals[key] = totals.get(key, 0) + int(value)
            if self.state(message_id)[0] == int(state):
                return totals
        raise AssertionError(f"outbox row {message_id} never reached {state.name}: "
                             f"{self.state(message_id)}; ckit acks totals {totals}")

    def close(self) -> None:
        for t in self.transports:
            t.close()


@pytest.fixture
def world(env: Env, tmp_path: Path) -> Iterator[World]:
    w = World(env, tmp_path)
    try:
        yield w
    finally:
        w.close()


@contextlib.contextmanager
def running(app: ConsumerApp) -> Iterator[None]:
    """Run `app` on a thread (not burst: RocketMQ cannot count its backlog) until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            app.run(stop=stop, max_seconds=TIMEOUT * 2)
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="e2e-app", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(TIMEOUT)
        app.close()
    assert not errors, errors


def flush_acks(app: ConsumerApp) -> bool:
    """Wait until the app's queued acks were delivered to the ack topic."""
    sender = app.pipeline().receipts
    return sender is not None and sender.flush(TIMEOUT)


def reserving(env: Env, app: ConsumerApp, topic: str,
              fail: Callable[[Message], None] | None = None) -> list[Message]:
    """Register a handler that reserves stock for `msg.json()["sku"]` and records each call."""
    calls: list[Message] = []

    @app.listener(topic)
    def reserve(msg: Message, session: Any) -> None:
        calls.append(msg)
        if fail is not None:
            fail(msg)
        add_reservation(env, session, msg.json()["sku"])

    return calls


# ------------------------------------------------------------------------------------- tests


def test_outbox_to_consumed_through_rocketmq_and_ckit_acks(world: World, env: Env) -> None:
    # Given
    [mid] = world.publish({"sku": "A"})
    world.relay()
    assert world.state(mid)[0] == int(OutboxState.SENT)
    app = world.app()
    calls = reserving(env, app, world.topic)
    # When
    with running(app):
        assert wait_for(lambda: env.effects() == {"A": 1}, TIMEOUT)
        assert flush_acks(app)
    totals = world.ckit_acks_until(mid, OutboxState.CONSUMED)
    # Then
    assert [m.id for m in calls] == [mid]
    assert calls[0].properties["ckit_src"] == world.producer
    assert calls[0].keys[0] == mid
    assert env.processed() == [(mid, "SUCCEEDED", None)]
    assert totals["consumed"] == 1


def test_a_handler_failing_twice_succeeds_on_the_third_delivery_via_the_retry_topic(
    world: World, env: Env
) -> None:
    [mid] = world.publish({"sku": "B"})
    world.relay()
    app = world.app()

    def flaky(msg: Message) -> None:
        if msg.reconsume_times < 2:
            raise RuntimeError(f"warehouse timeout #{msg.reconsume_times}")

    calls = reserving(env, app, world.topic, flaky)
    with running(app):
        assert wait_for(lambda: env.effects() == {"B": 1}, TIMEOUT)
        assert flush_acks(app)
        time.sleep(QUIET)
    assert [m.reconsume_times for m in calls] == [0, 1, 2]
    assert {m.id for m in calls} == {mid}
    assert {m.topic for m in calls} == {world.topic}  # not %RETRY%group
    world.ckit_acks_until(mid, OutboxState.CONSUMED)


def test_a_rejected_message_is_acked_once_and_its_row_becomes_rejected(
    world: World, env: Env
) -> None:
    [mid] = world.publish({"sku": "gone"})
    world.relay()
    app = world.app()

    def discontinued(msg: Message) -> None:
        raise Reject("sku discontinued")

    calls = reserving(env, app, world.topic, discontinued)
    with running(app):
        assert wait_for(lambda: len(env.processed()) == 1, TIMEOUT)
        assert flush_acks(app)
        time.sleep(QUIET)
    assert len(calls) == 1  # acked to the broker: no redelivery
    assert env.processed() == [(mid, "FAILED", "sku discontinued")]
    world.ckit_acks_until(mid, OutboxState.REJECTED)
    assert world.state(mid) == (int(OutboxState.REJECTED), f"{world.group}: sku discontinued")


def test_a_message_failing_every_time_ends_in_the_dead_letter_queue_with_its_reason(
    world: World, env: Env
) -> None:
    [mid] = world.publish({"sku": "C"})
    world.relay()
    app = world.app()

    def broken(msg: Message) -> None:
        raise RuntimeError("always down")

    calls = reserving(env, app, world.topic, broken)
    reader = world.transport()
    with running(app):
        assert wait_for(lambda: len(reader.dead_letters(world.group)) == 1, TIMEOUT,
                        interval=0.25)
        assert flush_acks(app)
        time.sleep(QUIET)
    why = "retries spent after 3 deliveries: RuntimeError: always down"
    [dead] = reader.dead_letters(world.group)
    assert dead.properties["ckit_id"] == mid
    assert json.loads(dead.body) == {"sku": "C"}
    assert dead.last_error == why
    # each attempt knew the group's limit and saw the previous attempt's reason
    assert [(m.reconsume_times, m.last_error, m.last_attempt) for m in calls] == [
        (0, "", False), (1, "RuntimeError: always down", False),
        (2, "RuntimeError: always down", True)]
    assert env.effects() == {}
    # the last attempt recorded why, and the producer's row is rejected with it
    assert env.processed() == [(mid, "DEAD_LETTERED", why)]
    world.ckit_acks_until(mid, OutboxState.REJECTED)
    assert world.state(mid) == (int(OutboxState.REJECTED), f"{world.group}: {why}")


def test_the_same_ckit_id_sent_twice_is_applied_once(world: World, env: Env) -> None:
    # Given: the row is sent, then re-queued (as the reconciler does) and sent again
    [mid] = world.publish({"sku": "D"})
    world.relay()
    with env.db.engine.begin() as conn:
        conn.execute(sa.text(
            f"UPDATE {env.db.names.outbox} SET state = :p, next_retry_at = :due, "
            "retry_count = retry_count + 1, lock_version = lock_version + 1 "
            "WHERE message_id = :m"),
            {"p": int(OutboxState.PENDING), "m": mid,
             "due": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
             - dt.timedelta(seconds=5)})
    world.relay()
    app = world.app()
    calls = reserving(env, app, world.topic)
    deliveries: list[Delivery] = []
    process = app.process

    def counting(delivery: Delivery) -> ConsumeStatus:
        deliveries.append(delivery)
        return process(delivery)

    app.process = counting  # type: ignore[method-assign]
    # When
    with running(app):
        assert wait_for(lambda: len(deliveries) == 2, TIMEOUT)
        assert flush_acks(app)
        time.sleep(QUIET)
    # Then: two broker messages (two UNIQ_KEYs) with one ckit_id, one handler call, one effect
    assert len({d.broker_message_id for d in deliveries}) == 2
    assert {d.properties["ckit_id"] for d in deliveries} == {mid}
    assert len(deliveries) == 2
    assert [m.id for m in calls] == [mid]
    assert env.effects() == {"D": 1}
    assert env.processed() == [(mid, "SUCCEEDED", None)]
    world.ckit_acks_until(mid, OutboxState.CONSUMED)


CHILD = r"""
import pathlib, sys, time
import sqlalchemy as sa
from consumer_kit import ConsumerApp
from consumer_kit.transports.rocketmq import RocketMQTransport

url, addr, group, topic, processed, stock, marker = sys.argv[1:8]
app = ConsumerApp(group=group, db=url, redis=None, receipts=None, processed_table=processed,
                  transport=RocketMQTransport(addr, delay_levels=(1.0,) * 18))
stock_table = sa.Table(stock, sa.MetaData(), autoload_with=app.engine)

@app.listener(topic)
def reserve(msg, session):
    session.execute(sa.insert(stock_table).values(sku=msg.json()["sku"], reserved=1))
    session.flush()
    # written whole, then renamed: the test waits for the marker to exist and reads it
    pathlib.Path(marker + '.tmp').write_text(msg.id)
    pathlib.Path(marker + '.tmp').replace(marker)
    time.sleep(600)  # killed here, mid-handler, with the business write not committed

app.run(max_seconds=300)
"""


def test_a_consumer_killed_mid_handler_leaves_the_message_to_be_applied_once(
    world: World, env: Env, tmp_path: Path
) -> None:
    # Given: a consumer process that is inside the handler
    [mid] = world.publish({"sku": "K"})
    world.relay()
    marker = tmp_path / "in-handler"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, env.db.url, world.addr, world.group, world.topic,
         env.db.names.processed, env.stock.name, str(marker)],
        env={**os.environ, "HOME": str(tmp_path)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for(marker.exists, TIMEOUT, interval=0.1), "the child never reached the handler"
        assert marker.read_text() == mid
        # When: kill -9
        os.kill(child.pid, signal.SIGKILL)
        child.wait(TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(TIMEOUT)
        if child.stderr is not None:
            child.stderr.close()
    assert env.effects() == {}  # the killed transaction never committed
    # Then: another consumer of the group gets the message again and applies it once
    app = world.app(receipts=None)
    calls = reserving(env, app, world.topic)
    with running(app):
        assert wait_for(lambda: env.effects() == {"K": 1}, TIMEOUT)
        time.sleep(QUIET)
    assert {m.id for m in calls} == {mid}
    assert env.effects() == {"K": 1}
    assert env.processed() == [(mid, "SUCCEEDED", None)]


def test_the_c_client_callback_threads_keep_a_bounded_set_of_redis_connections(
        world: World, env: Env) -> None:
    # The 4.x client calls back on C++ threads; CPython gives each callback a fresh thread
    # state, so anything kept in a threading.local is lost between messages. The consume
    # threads' kept Redis connections are keyed by thread id: a few per thread, not one per
    # message (which would never go back to the pool).
    from consumer_kit.dedupe.scripts import kept_count, release_kept

    pool = env.redis.connection_pool
    release_kept(pool)  # whatever earlier tests' threads left
    mids = world.publish(*({"sku": f"S{i}"} for i in range(60)))
    world.relay()
    app = world.app()
    reserving(env, app, world.topic)
    try:
        with running(app):
            assert wait_for(lambda: len(env.processed()) == len(mids), TIMEOUT)
        kept = kept_count(pool)
        assert 1 <= kept <= 8, f"{kept} Redis connections kept after 60 messages"
    finally:
        release_kept(pool)
