"""The consumer app the fault run starts twice: `ckit consume bench.faults.app:app`.

Its handler writes one effect row per order in the same transaction as the processed row. The
effect table has no unique key, so a message applied twice leaves two rows: the checks count
them. Configured by environment (set by the runner): FAULTS_INVENTORY_URL, FAULTS_REDIS_URL,
FAULTS_TRANSPORT, FAULTS_REDIS_CLAIMS (`every`, the default, or `adaptive`). Receipts go back
on the producer's receipt topic (`ckit receipts` applies them).
"""

from __future__ import annotations

import os
import time

import sqlalchemy as sa
from sqlalchemy.orm import Session

from bench.faults import kit, world

app = kit.ConsumerApp(
    group=world.GROUP,
    db=os.environ.get("FAULTS_INVENTORY_URL", "sqlite:///faults-inventory.db"),
    redis=os.environ.get("FAULTS_REDIS_URL") or None,
    transport=os.environ.get("FAULTS_TRANSPORT"),
    receipts="topic",
    redis_claims=os.environ.get("FAULTS_REDIS_CLAIMS", "every"),
)


@app.listener(world.TOPIC, tags=world.TAGS)
def apply_order(msg: kit.Message, session: Session) -> None:
    """The effect: one row per order (doubles show as two rows)."""
    session.execute(sa.insert(world.effects).values(
        order_id=int(msg.json()["order_id"]), message_id=msg.id, pid=os.getpid(),
        at=time.time()))
