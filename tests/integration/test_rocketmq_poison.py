"""A failing message never takes healthy messages with it (issue 16), on the real broker.

Pairs of a poison message (its handler always raises) and a healthy message (its handler fails
once, then applies) are sent by producers that are not consumer-kit (the plain 2.0.0 client and
the broker's own `mqadmin sendMessage`, with and without KEYS), and consumed by a real
`ckit consume` process with a group whose `retryMaxTimes` is 2. Every healthy message must be
applied exactly once (the effect table has no unique key, so a double shows) and `%DLQ%group`
must hold exactly the poison messages. Several rounds in one consumer run, each sending its
pairs differently, so the batches the native client pulls differ.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import TransportError
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription, Verdict
from consumer_kit.transports.rocketmq import RocketMQTransport
from consumer_kit.transports.rocketmq.sendback import SentBack
from tests import services
from tests.consumer.conftest import Env, _env
from tests.integration.foreign import CkitConsume, RawProducer, mqadmin_send

pytestmark = [pytest.mark.rocketmq, pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

RETRY_MAX_TIMES = 2
PAIRS = 8
ROUND_TIMEOUT = 60.0
START_TIMEOUT = 60.0
QUIET = 3.0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    services.require("rocketmq", services.ping_rocketmq)
    yield from _env("mariadb", tmp_path)


@dataclasses.dataclass
class Round:
    """What one round sent and what became of it."""

    number: int
    how: str
    poison: list[str] = dataclasses.field(default_factory=list)
    healthy: list[str] = dataclasses.field(default_factory=list)
    ids: dict[str, str] = dataclasses.field(default_factory=dict)  # label -> broker message id

    def report(self, effects: collections.Counter[str], dead: collections.Counter[str]) -> str:
        once = sum(1 for h in self.healthy if effects[h] == 1)
        never = sum(1 for h in self.healthy if effects[h] == 0)
        twice = sum(1 for h in self.healthy if effects[h] > 1)
        dead_healthy = [h for h in self.healthy if dead[h]]
        applied_then_dead = [h for h in dead_healthy if effects[h]]
        return (f"round {self.number} ({self.how}): healthy applied exactly once {once}/"
                f"{len(self.healthy)}, never {never}, more than once {twice}; DLQ: poison "
                f"{sum(1 for p in self.poison if dead[p])}/{len(self.poison)} "
                f"(copies {sum(dead[p] for p in self.poison)}), healthy {len(dead_healthy)}, "
                f"of them already applied {len(applied_then_dead)}")

    def settled(self, effects: collections.Counter[str], dead: collections.Counter[str]) -> bool:
        """Every poison message dead-lettered and every healthy one applied or dead-lettered."""
        return all(dead[p] for p in self.poison) and all(
            effects[h] or dead[h] for h in self.healthy)


class Scenario:
    """The topic, group, producers and readers of one test."""

    def __init__(self, env: Env, tmp_path: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.env = env
        self.addr = services.rocketmq_addr()
        self.topic = f"POISON_{tag}"
        self.group = f"poison-{tag}"
        self.reader = RocketMQTransport(self.addr, producer_group=f"poison-reader-{tag}",
                                        client_log_dir=str(tmp_path / "rocketmq-cpp"))
        self.reader.admin.create_topic(self.topic, queues=4)
        self.reader.admin.prepare_group(self.group, retry_max_times=RETRY_MAX_TIMES)
        self.raw = RawProducer(self.addr)
        self.consume_env = {
            "P_ADDR": self.addr, "P_GROUP": self.group, "P_TOPIC": self.topic,
            "P_DB": env.db.url, "P_REDIS": services.redis_url(),
            "P_PROCESSED": env.db.names.processed, "P_STOCK": env.stock.name,
            "P_LOG_DIR": str(tmp_path / "rocketmq-cpp"),
        }

    def effects(self) -> collections.Counter[str]:
        with self.env.db.engine.connect() as conn:
            return collections.Counter({sku: n for sku, n in conn.execute(
                sa.select(self.env.stock.c.sku, sa.func.count()).group_by(self.env.stock.c.sku))})

    def dead(self) -> collections.Counter[str]:
        return collections.Counter(json.loads(d.body)["label"]
                                   for d in self.reader.dead_letters(self.group))

    def send_raw(self, rnd: Round, kind: str, i: int, *, keys: bool) -> None:
        label = f"r{rnd.number}-{kind[0]}{i}"
        rnd.ids[label] = self.raw.send(
            self.topic, {"kind": kind, "label": label},
            keys=f"order-{label}-{uuid.uuid4().hex[:6]}" if keys else None,
            tags="created", properties={"x_origin": "java-order-service"})
        (rnd.poison if kind == "poison" else rnd.healthy).append(label)

    def send_mqadmin(self, rnd: Round, pairs: list[tuple[int, bool]]) -> None:
        """Pairs sent by `mqadmin sendMessage` (one JVM each, a few seconds apart)."""
        for i, keys in pairs:
            for kind in ("poison", "healthy"):
                label = f"r{rnd.number}-{kind[0]}{i}"
                rnd.ids[label] = self._mqadmin_once(label, kind, f"admin-{label}" if keys else None)
                (rnd.poison if kind == "poison" else rnd.healthy).append(label)

    def _mqadmin_once(self, label: str, kind: str, keys: str | None) -> str:
        """`mqadmin sendMessage` gives up after 3 s, JVM start included, which a loaded
        machine overruns: after a failure, send again only when the broker does not have it
        (a second copy would be a second message, applied twice)."""
        for _attempt in range(3):
            try:
                return mqadmin_send(self.topic, {"kind": kind, "label": label}, keys=keys,
                                    tags="created")
            except AssertionError as exc:
                topic = self.reader.admin.read_topic(self.topic, group=f"{self.group}-check")
                stored = [m for m in topic if json.loads(m.body)["label"] == label]
                if stored:
                    return stored[0].properties["UNIQ_KEY"]
                print(f"mqadmin sendMessage {label}: {exc}; sending again")
        raise AssertionError(f"mqadmin sendMessage {label} failed three times")

    def close(self) -> None:
        self.raw.close()
        self.reader.close()


def send_round(s: Scenario, number: int) -> Round:
    """Round 0: poison then healthy, with KEYS; round 1: healthy then poison, without KEYS;
    round 2: two pairs by mqadmin (with and without KEYS), then raw pairs, keys alternating."""
    if number == 0:
        rnd = Round(number, "raw client, poison first, KEYS")
        for i in range(PAIRS):
            s.send_raw(rnd, "poison", i, keys=True)
            s.send_raw(rnd, "healthy", i, keys=True)
    elif number == 1:
        rnd = Round(number, "raw client, healthy first, no KEYS")
        for i in range(PAIRS):
            s.send_raw(rnd, "healthy", i, keys=False)
            s.send_raw(rnd, "poison", i, keys=False)
    else:
        rnd = Round(number, "mqadmin sendMessage x2 pairs + raw client, KEYS alternating")
        s.send_mqadmin(rnd, [(0, True), (1, False)])
        for i in range(2, PAIRS):
            s.send_raw(rnd, "poison", i, keys=i % 2 == 0)
            s.send_raw(rnd, "healthy", i, keys=i % 2 == 1)
    return rnd


def test_a_poison_message_never_takes_a_healthy_neighbour_to_the_dead_letter_queue(
    env: Env, tmp_path: Path
) -> None:
    # Given: `ckit consume` running the app, a group with retryMaxTimes 2, the consumer online
    s = Scenario(env, tmp_path)
    rounds: list[Round] = []
    lines: list[str] = []
    try:
        with CkitConsume(tmp_path, s.consume_env, max_seconds=280) as consumer:
            s.raw.send(s.topic, {"kind": "probe", "label": "probe"})
            assert wait_for(lambda: s.effects()["probe"] == 1, START_TIMEOUT, interval=0.2), \
                f"the consumer never came up:\n{consumer.output()[-3000:]}"
            # When: each round sends its pairs and waits until every message settled
            for number in range(3):
                rnd = send_round(s, number)
                rounds.append(rnd)
                wait_for(lambda rnd=rnd: rnd.settled(s.effects(), s.dead()), ROUND_TIMEOUT,
                         interval=0.5)
                time.sleep(QUIET)  # late doubles or late dead letters show up here
                lines.append(rnd.report(s.effects(), s.dead()))
                print(lines[-1])
        # Then
        effects, dead = s.effects(), s.dead()
        summary = "\n".join(lines)
        for rnd in rounds:
            assert {h: effects[h] for h in rnd.healthy} == {h: 1 for h in rnd.healthy}, summary
            assert {p: dead[p] for p in rnd.poison} == {p: 1 for p in rnd.poison}, summary
        assert set(dead) == {p for rnd in rounds for p in rnd.poison}, summary
        dead_letters = s.reader.dead_letters(s.group)
        assert all("poison pill" in d.last_error for d in dead_letters), \
            [d.last_error for d in dead_letters]
        # the dead letters are the messages as sent: same id, the foreign property, the topic
        ids = {label: i for rnd in rounds for label, i in rnd.ids.items()}
        raw = s.reader.admin.read_topic(f"%DLQ%{s.group}", group=f"{s.group}-dlq-reader")
        for m in raw:
            label = json.loads(m.body)["label"]
            assert m.properties["UNIQ_KEY"] == ids[label]
            assert m.properties["RETRY_TOPIC"] == s.topic
            assert m.properties["TAGS"] == "created"
            assert m.properties.get("x_origin", "java-order-service") == "java-order-service"
        assert sum("x_origin" in m.properties for m in raw) == len(raw) - 2  # 2 by mqadmin
    finally:
        s.close()


def test_when_the_send_back_fails_the_native_redelivery_is_the_last_resort(
    tmp_path: Path,
) -> None:
    # Given: a consumer whose own send-back fails (as with a broker refusing it)
    services.require("rocketmq", services.ping_rocketmq)
    tag = uuid.uuid4().hex[:8]
    transport = RocketMQTransport(services.rocketmq_addr(), producer_group=f"lastresort-{tag}",
                                  client_log_dir=str(tmp_path / "rocketmq-cpp"))
    topic, group = f"LASTRESORT_{tag}", f"lastresort-{tag}"
    transport.admin.create_topic(topic, queues=1)
    transport.admin.prepare_group(group, retry_max_times=RETRY_MAX_TIMES)
    calls: list[Delivery] = []

    def handle(d: Delivery) -> Verdict:
        calls.append(d)
        if d.reconsume_times == 0:
            return Verdict(ConsumeStatus.RECONSUME_LATER, "stock service down")
        return Verdict(ConsumeStatus.CONSUME_SUCCESS)

    consumer = transport.consumer(group, [Subscription(topic)], handle)
    attempts: list[int] = []

    def refuse(delivery: Delivery, offset: int, reason: str, *, spend: bool = True,
               until: object = None) -> SentBack:
        attempts.append(offset)
        raise TransportError("refused by the broker")

    consumer.send_back.send_back = refuse  # type: ignore[method-assign]
    consumer.start()
    try:
        # When
        transport.send(OutgoingMessage(topic, b'{"n": 1}'))
        # Then: redelivered by the native client (no reason travels that way), not lost
        assert wait_for(lambda: len(calls) >= 2, 30.0)
        time.sleep(QUIET)
        assert [d.reconsume_times for d in calls] == [0, 1]
        assert calls[1].broker_message_id == calls[0].broker_message_id
        assert len(attempts) == 1 and attempts[0] > 0
        assert transport.dead_letters(group) == []
    finally:
        consumer.shutdown()
        transport.close()
