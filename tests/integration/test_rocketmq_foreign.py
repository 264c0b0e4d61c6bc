"""Messages consumer-kit did not send, from the broker's own `mqadmin sendMessage`, consumed by
`ckit consume` (the README section "Consuming messages consumer-kit did not send"): which id
dedupes them, what a redelivery of a message without KEYS looks like, no receipt and no noise
without `ckit_src`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.testing.harness import wait_for
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from tests import services
from tests.consumer.conftest import Env, _env
from tests.harnesses.rocketmq import wait_committed
from tests.integration.foreign import CkitConsume, mqadmin_send

pytestmark = [pytest.mark.rocketmq, pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

TIMEOUT = 60.0
QUIET = 3.0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    services.require("rocketmq", services.ping_rocketmq)
    yield from _env("mariadb", tmp_path)


def send_once(admin: RocketMQAdmin, topic: str, body: dict[str, str], *,
              keys: str | None = None) -> str:
    """`mqadmin sendMessage`, sent again only when the broker does not have it (the tool gives
    up after 3 s, JVM start included, which a loaded machine overruns)."""
    for _attempt in range(3):
        try:
            return mqadmin_send(topic, body, keys=keys, tags="created")
        except AssertionError:
            for m in admin.read_topic(topic, group=f"check-{topic}"):
                if json.loads(m.body) == body:
                    return m.properties["UNIQ_KEY"]
    raise AssertionError(f"mqadmin sendMessage {body} failed three times")


def test_messages_from_the_brokers_own_tool_are_deduped_by_keys_else_by_the_broker_id(
    env: Env, tmp_path: Path
) -> None:
    # Given: `ckit consume` (receipts="topic") on a topic no consumer-kit producer uses
    tag = uuid.uuid4().hex[:8]
    addr = services.rocketmq_addr()
    topic, group = f"FOREIGN_{tag}", f"foreign-{tag}"
    admin = RocketMQAdmin(addr)
    admin.create_topic(topic, queues=4)
    admin.prepare_group(group, retry_max_times=2)
    consume_env = {
        "P_ADDR": addr, "P_GROUP": group, "P_TOPIC": topic, "P_DB": env.db.url,
        "P_REDIS": services.redis_url(), "P_PROCESSED": env.db.names.processed,
        "P_STOCK": env.stock.name, "P_LOG_DIR": str(tmp_path / "rocketmq-cpp"),
    }
    with CkitConsume(tmp_path, consume_env, max_seconds=200) as consumer:
        # When: a message with two KEYS; one without KEYS whose handler fails once; the first
        # sent again by its producer (same KEYS, a new broker id)
        send_once(admin, topic, {"kind": "plain", "label": "with-keys"}, keys="order-1001 ref-9")
        no_keys_id = send_once(admin, topic, {"kind": "healthy", "label": "no-keys"})
        resent_id = send_once(admin, topic, {"kind": "plain", "label": "with-keys", "again": "1"},
                              keys="order-1001")
        assert wait_for(lambda: len(env.processed()) == 2 and env.effects().get("no-keys") == 1,
                        TIMEOUT, interval=0.25), consumer.output()[-3000:]
        # and the re-sent one handled too (it adds no row: its committed offset says so)
        assert wait_committed(admin, group, topic, timeout=TIMEOUT), consumer.output()[-3000:]
        output = consumer.stop()
    # Then: KEYS' first entry is the id; without KEYS the broker's id, the same on redelivery
    assert resent_id != no_keys_id
    with env.db.engine.connect() as conn:
        rows = {r.message_id: r for r in conn.execute(sa.text(
            f"SELECT message_id, status, src, attempts FROM {env.db.names.processed}"))}
        applied = sorted(tuple(r) for r in conn.execute(
            sa.select(env.stock.c.sku, env.stock.c.reserved)))
    assert sorted(rows) == sorted(["order-1001", no_keys_id])
    assert {(r.status, r.src) for r in rows.values()} == {("SUCCEEDED", None)}
    assert rows[no_keys_id].attempts == 2  # applied on its redelivery, under the same id
    assert applied == [("no-keys", 1), ("with-keys", 0)]  # the re-sent one was a duplicate
    counts = dict(pair.split("=") for pair in output.strip().splitlines()[-1].split())
    assert counts == {"succeeded": "2", "duplicate": "1", "rejected": "0", "busy": "0",
                      "retry": "1", "dead_letter": "0"}
    # no receipt without ckit_src, and no noise about it: the one warning is the handler's
    noisy = [line for line in output.splitlines() if (" WARNING " in line or " ERROR " in line)
             and "poison_app.handle raised, reconsume later" not in line]
    assert noisy == [], noisy
    assert "ckit_src" not in output and "receipt" not in output
