"""The inventory service: reserves stock for each ORDER_CREATED, exactly once.

    INVENTORY_DB_URL=sqlite:///inventory.db CKIT_TRANSPORT=sql+sqlite:///ckit-mq.db \\
        ckit consume examples.inventory:app --burst

Redis is optional (CKIT_REDIS_URL); without it the processed table alone dedupes. Receipts go
back on the producer's receipt topic (`ckit receipts --producer order-service` applies them), or
straight into the producer's database when CKIT_RECEIPTS is its URL.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from consumer_kit import ConsumerApp, Message, Reject
from consumer_kit.core.schema import build_metadata

metadata = sa.MetaData()
reservations = sa.Table(
    "stock_reservations", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.Integer, nullable=False),
    sa.Column("sku", sa.String(32), nullable=False),
    sa.Column("qty", sa.Integer, nullable=False),
)
KNOWN_SKUS = {"SKU-0", "SKU-1", "SKU-2"}



def reserve_stock(msg: Message, session: Session) -> None:
    """One reservation row per order, in the same transaction as the processed row."""
    order = msg.json()
    if order["sku"] not in KNOWN_SKUS:
        raise Reject(f"unknown sku {order['sku']}")
    session.execute(sa.insert(reservations).values(
        order_id=order["order_id"], sku=order["sku"], qty=order["qty"]))


def make_app(*, db: Any, transport: Any, redis: Any = None, receipts: Any = "topic"
             ) -> ConsumerApp:
    """The inventory consumer group wired to the given database, transport, Redis and receipt
    route."""
    inventory = ConsumerApp(group="inventory", db=db, redis=redis, transport=transport,
                            receipts=receipts)
    inventory.listener("ORDER_CREATED", tags="created")(reserve_stock)
    return inventory


def setup(engine: Engine) -> None:
    """Create the business table and the processed table."""
    metadata.create_all(engine)
    build_metadata(include_transport=False).tables["ckit_processed"].create(engine, checkfirst=True)


app = make_app(
    db=os.environ.get("INVENTORY_DB_URL", "sqlite:///inventory.db"),
    redis=os.environ.get("CKIT_REDIS_URL") or None,
    transport=os.environ.get("CKIT_TRANSPORT", "sql+sqlite:///ckit-mq.db"),
    receipts=os.environ.get("CKIT_RECEIPTS", "topic") or None,
)

if __name__ == "__main__":  # python -m examples.inventory: create the tables
    setup(app.engine)
    print(f"inventory tables ready in {app.engine.url}")
