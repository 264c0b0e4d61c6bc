"""End to end over the RocketMQ 5 proxy with the `rocketmq5://` transport: the tests of
test_rocketmq_e2e.py (outbox -> relay -> broker -> decorated consumer -> ack topic -> `ckit acks`
-> CONSUMED; fail twice then succeed; reject; DLQ checked on the broker; the same ckit_id twice)
collected again with a `world` on 5.x, plus this transport's own kill -9 and reason tests.

Needs scripts/rocketmq5.sh (proxy 8081, name server 9886); databases as in the 4.x tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit import Message
from consumer_kit.core.messages import Verdict, as_verdict
from consumer_kit.core.states import OutboxState
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services
from tests.consumer.conftest import Env, _env
from tests.harnesses.rocketmq5 import FAST_OPTIONS
from tests.integration.test_rocketmq_e2e import (  # noqa: F401 - collected again here
    MAX_RECONSUME,
    QUIET,
    TIMEOUT,
    World,
    flush_acks,
    reserving,
    running,
    test_a_handler_failing_twice_succeeds_on_the_third_delivery_via_the_retry_topic,
    test_a_rejected_message_is_acked_once_and_its_row_becomes_rejected,
    test_outbox_to_consumed_through_rocketmq_and_ckit_acks,
)

pytestmark = [pytest.mark.rocketmq5, pytest.mark.slow]


def url() -> str:
    return (f"rocketmq5://{services.rocketmq5_proxy_addr()}"
            f"?namesrv={services.rocketmq5_namesrv_addr()}")


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=[pytest.mark.mariadb,
                                                                 pytest.mark.redis])])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    services.require("rocketmq5", services.ping_rocketmq5)
    yield from _env(request.param, tmp_path)


class World5(World):
    """The 4.x tests' world with `rocketmq5://` transports (topics created as they are used)."""

    def transport(self) -> RocketMQ5Transport:  # type: ignore[override]
        t = RocketMQ5Transport(url(), max_reconsume_times=MAX_RECONSUME, create_topics=True,
                               **FAST_OPTIONS)  # type: ignore[arg-type]
        self.transports.append(t)  # type: ignore[arg-type]
        return t

    def ckit_acks_until(self, message_id: str, state: OutboxState) -> dict[str, int]:
        """Run `ckit acks --burst` over rocketmq5:// (a real process) until the row is `state`."""
        names = self.env.db.names
        totals: dict[str, int] = {}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            proc = subprocess.run(
                [sys.executable, "-m", "consumer_kit.cli.main", "acks", "--url", self.env.db.url,
                 "--transport", url(), "--producer", self.producer,
                 "--outbox-table", names.outbox, "--receipt-table", names.receipts, "--burst",
                 "--json"],
                capture_output=True, text=True, timeout=TIMEOUT, check=False,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            for key, value in json.loads(proc.stdout).items():
                totals[key] = totals.get(key, 0) + int(value)
            if self.state(message_id)[0] == int(state):
                return totals
        raise AssertionError(f"outbox row {message_id} never reached {state.name}: "
                             f"{self.state(message_id)}; ckit acks totals {totals}")


@pytest.fixture
def world(env: Env, tmp_path: Path) -> Iterator[World]:
    w = World5(env, tmp_path)
    try:
        yield w
    finally:
        w.close()


def test_a_message_failing_every_time_is_dead_lettered_with_its_reason_and_rejected(
    world: World, env: Env
) -> None:
    """Unlike 4.x, this transport tells the pipeline the group's limit: the last attempt is
    recorded DEAD_LETTERED with the reason, the producer gets a rejected receipt, and the dead
    letter on the broker carries the same reason."""
    # Given
    [mid] = world.publish({"sku": "C"})
    world.relay()
    app = world.app()

    def broken(msg: Message) -> None:
        raise RuntimeError("always down")

    calls = reserving(env, app, world.topic, broken)
    reader = world.transport()
    # When
    with running(app):
        assert wait_for(lambda: len(reader.dead_letters(world.group)) == 1, TIMEOUT,
                        interval=0.25)
        assert flush_acks(app)
        time.sleep(QUIET)
    # Then
    why = f"retries spent after {MAX_RECONSUME + 1} deliveries: RuntimeError: always down"
    [dead] = reader.dead_letters(world.group)
    assert dead.properties["ckit_id"] == mid
    assert json.loads(dead.body) == {"sku": "C"}
    assert dead.last_error == why
    assert [m.reconsume_times for m in calls] == list(range(MAX_RECONSUME + 1))
    assert env.effects() == {}
    assert env.processed() == [(mid, "DEAD_LETTERED", why)]
    world.ckit_acks_until(mid, OutboxState.REJECTED)


def test_the_same_ckit_id_sent_twice_is_applied_once(world: World, env: Env) -> None:
    """As in the 4.x tests, except that the two copies may be handled at the same moment (two
    workers each receive one): the second then finds the first's Redis lease and is answered
    RECONSUME_LATER, and comes back once as a duplicate."""
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
    answers: list[ConsumeStatus] = []
    process = app.process

    def counting(delivery: Delivery) -> ConsumeStatus | Verdict:
        deliveries.append(delivery)
        answer = process(delivery)
        answers.append(as_verdict(answer).status)
        return answer

    app.process = counting  # type: ignore[method-assign]
    # When
    with running(app):
        assert wait_for(lambda: answers.count(ConsumeStatus.CONSUME_SUCCESS) == 2, TIMEOUT), (
            [(d.broker_message_id[-6:], d.reconsume_times) for d in deliveries], answers)
        assert flush_acks(app)
        time.sleep(QUIET)
    # Then: two broker messages with one ckit_id, one handler call, one effect
    assert len({d.broker_message_id for d in deliveries}) == 2
    assert {d.properties["ckit_id"] for d in deliveries} == {mid}
    firsts = [d for d in deliveries if d.reconsume_times == 0]
    assert len(firsts) == 2  # anything more is the busy copy coming back, once
    assert len(deliveries) - len(firsts) == answers.count(ConsumeStatus.RECONSUME_LATER) <= 1
    assert [m.id for m in calls] == [mid]
    assert env.effects() == {"D": 1}
    assert env.processed() == [(mid, "SUCCEEDED", None)]
    world.ckit_acks_until(mid, OutboxState.CONSUMED)


CHILD = r"""
import pathlib, sys, time
import sqlalchemy as sa
from consumer_kit import ConsumerApp
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport

url, endpoint, group, topic, processed, stock, marker = sys.argv[1:8]
app = ConsumerApp(group=group, db=url, redis=None, receipts=None, processed_table=processed,
                  transport=RocketMQ5Transport(endpoint, retry_delays=(1.0,),
                                               invisible_seconds=5.0))
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
        [sys.executable, "-c", CHILD, env.db.url, url(), world.group, world.topic,
         env.db.names.processed, env.stock.name, str(marker)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
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
    # Then: after its invisible time another consumer of the group gets it and applies it once
    app = world.app(receipts=None)
    calls = reserving(env, app, world.topic)
    with running(app):
        assert wait_for(lambda: env.effects() == {"K": 1}, TIMEOUT)
        time.sleep(QUIET)
    assert {m.id for m in calls} == {mid}
    assert calls[-1].reconsume_times >= 1  # the broker counted the killed attempt
    assert env.effects() == {"K": 1}
    assert env.processed() == [(mid, "SUCCEEDED", None)]


def test_the_reason_of_reconsume_later_comes_with_the_redelivery_and_into_the_dead_letter(
    world: World,
) -> None:
    # Given: a raw consumer that answers RECONSUME_LATER with a reason naming the attempt
    transport = world.transport()
    seen: list[Delivery] = []

    def refuse(delivery: Delivery) -> Verdict:
        seen.append(delivery)
        return Verdict(ConsumeStatus.RECONSUME_LATER, f"stock service down #{len(seen)}")

    consumer = transport.consumer(world.group, [Subscription(world.topic)], refuse)
    consumer.start()
    try:
        # When
        transport.send(OutgoingMessage(world.topic, b'{"sku": "R"}', keys=("R1",),
                                       properties={"ckit_id": "R1", "x_custom": "r"}))
        dead = []
        assert wait_for(lambda: bool(dead.extend(transport.dead_letters(world.group)) or dead),
                        TIMEOUT, interval=0.5)
    finally:
        consumer.shutdown()
    # Then: each redelivery carries the previous answer's reason; the dead letter the last one
    assert [d.reconsume_times for d in seen] == list(range(MAX_RECONSUME + 1))
    assert [d.last_error for d in seen] == ["", "stock service down #1", "stock service down #2"]
    assert {d.max_reconsume_times for d in seen} == {MAX_RECONSUME}
    [letter] = dead
    assert letter.last_error == f"stock service down #{MAX_RECONSUME + 1}"
    assert letter.topic == world.topic
    assert letter.body == b'{"sku": "R"}'
    assert dict(letter.properties) == {"ckit_id": "R1", "x_custom": "r"}
    assert letter.keys == "R1"


def test_an_exception_in_the_callback_is_the_reason_of_the_redelivery(world: World) -> None:
    transport = world.transport()
    seen: list[Delivery] = []

    def explode_once(delivery: Delivery) -> ConsumeStatus:
        seen.append(delivery)
        if len(seen) == 1:
            raise RuntimeError("warehouse " + uuid.uuid4().hex[:4])
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(world.group, [Subscription(world.topic)], explode_once)
    consumer.start()
    try:
        transport.send(OutgoingMessage(world.topic, b"x"))
        assert wait_for(lambda: len(seen) >= 2, TIMEOUT)
    finally:
        consumer.shutdown()
    assert seen[1].last_error.startswith("RuntimeError: warehouse ")
    assert seen[1].broker_message_id == seen[0].broker_message_id
