"""The order service: writes an order and its ORDER_CREATED message in one transaction.

    ORDERS_DB_URL=sqlite:///orders.db CKIT_TRANSPORT=sql+sqlite:///ckit-mq.db \\
        python -m examples.orders 10          # place 10 orders, sent right after each commit

Switching to RocketMQ changes only CKIT_TRANSPORT (rocketmq://127.0.0.1:9876). Whatever the
dispatcher could not send (a crash, the broker down) is sent by `ckit relay --url $ORDERS_DB_URL`.
"""

from __future__ import annotations

import os
import sys

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import build_metadata
from consumer_kit.transports import open_transport
from outbox_producer import Dispatcher, Outbox

PRODUCER = "order-service"
TOPIC = "ORDER_CREATED"

metadata = sa.MetaData()
orders = sa.Table(
    "orders", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(32), nullable=False),
    sa.Column("qty", sa.Integer, nullable=False),
)


def setup(engine: Engine) -> None:
    """Create the business table and the outbox tables."""
    metadata.create_all(engine)
    build_metadata(include_transport=False).create_all(engine)


def place_order(session: Session, outbox: Outbox, order_id: int, sku: str, qty: int) -> str:
    """The business change and its message, in the caller's transaction."""
    session.execute(sa.insert(orders).values(id=order_id, sku=sku, qty=qty))
    return outbox.publish(session, TOPIC, {"order_id": order_id, "sku": sku, "qty": qty},
                          biz_type="order", biz_key=str(order_id), tags="created")


def main(argv: list[str]) -> None:
    """Place N orders (default 5) and send them after commit."""
    count = int(argv[0]) if argv else 5
    engine = make_engine(os.environ.get("ORDERS_DB_URL", "sqlite:///orders.db"))
    setup(engine)
    transport = open_transport(os.environ.get("CKIT_TRANSPORT", "sql+sqlite:///ckit-mq.db"))
    dispatcher = Dispatcher(engine, transport).start()
    outbox = Outbox(engine, producer=PRODUCER, dispatcher=dispatcher)
    with engine.connect() as conn:
        start = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(orders.c.id), 0)))
                    .scalar() or 0) + 1
    for order_id in range(start, start + count):
        with Session(engine) as session, session.begin():
            place_order(session, outbox, order_id, f"SKU-{order_id % 3}", 1)
    dispatcher.close()
    transport.close()
    print(f"placed orders {start}..{start + count - 1}")


if __name__ == "__main__":
    main(sys.argv[1:])
