"""The app that `ckit consume tests.integration.poison_app:app` runs in the poison-message tests.

Configured by environment variables (the test sets them): P_ADDR (name server), P_GROUP, P_TOPIC,
P_DB (consumer database URL), P_REDIS, P_PROCESSED (processed table), P_STOCK (the effect table:
one row per applied effect, no unique key, so a double effect shows as two rows), P_LOG_DIR (the
C++ client's log folder).

Bodies are JSON `{"kind": ..., "label": ...}`:

- `poison`: the handler always raises;
- `healthy`: the handler raises on the first delivery (reconsume count 0), applies on the next,
  which must carry the first failure's reason as `msg.last_error` (else it raises again);
- anything else (`plain`, `probe`): applied at once.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message
from consumer_kit.transports.rocketmq import RocketMQTransport

env = os.environ
stock = sa.Table(env["P_STOCK"], sa.MetaData(),
                 sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                 sa.Column("sku", sa.String(32), nullable=False),
                 sa.Column("reserved", sa.Integer, nullable=False))

app = ConsumerApp(
    group=env["P_GROUP"], db=env["P_DB"], redis=env["P_REDIS"], receipts="topic",
    processed_table=env["P_PROCESSED"], threads=2,
    transport=RocketMQTransport(env["P_ADDR"], client_log_dir=env["P_LOG_DIR"],
                                producer_group=f"{env['P_GROUP']}-receipts"),
)


@app.listener(env["P_TOPIC"])
def handle(msg: Message, session: Any) -> None:
    body = msg.json()
    if body["kind"] == "poison":
        raise RuntimeError(f"poison pill {body['label']}")
    if body["kind"] == "healthy" and msg.reconsume_times == 0:
        raise RuntimeError(f"{body['label']}: warehouse timeout (fails once)")
    if body["kind"] == "healthy" and "(fails once)" not in msg.last_error:
        raise RuntimeError(f"{body['label']}: redelivered without the reason: {msg.last_error!r}")
    # the effect: reserved = the reconsume count it was applied at (for the report)
    session.execute(sa.insert(stock).values(sku=body["label"], reserved=msg.reconsume_times))
