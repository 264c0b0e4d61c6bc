"""The producer process: places orders 1..N at a bounded rate, each order row and its outbox row
in one transaction, sent right after commit by the after-commit dispatcher.

    FAULTS_ORDERS_URL=mysql+pymysql://... FAULTS_TRANSPORT=rocketmq://127.0.0.1:19876 \\
        python -m bench.faults.producer --orders 1000 --rate 10

A restarted producer skips the orders already committed. A database error (the server killed
under it) is retried with a bounded back-off; an order whose commit succeeded but whose answer
was lost is found by its primary key on the retry and skipped.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from bench.faults import kit, world

log = logging.getLogger("faults.producer")

BACKOFF = (0.2, 0.5, 1.0, 2.0)
#: the rate is not made up after an outage beyond this much backlog (seconds of orders)
MAX_CATCH_UP = 1.0


def committed_ids(engine: sa.engine.Engine) -> set[int]:
    """Ids of the orders already committed (waits out a database that is down)."""
    for attempt in range(10_000):
        try:
            with engine.connect() as conn:
                return set(conn.execute(sa.select(world.orders.c.id)).scalars())
        except DBAPIError as exc:
            log.warning("reading committed orders failed (%s); retrying", exc.__class__.__name__)
            time.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
    raise SystemExit("the orders database never answered")


def place(engine: sa.engine.Engine, outbox: kit.Outbox, order_id: int) -> bool:
    """Commit order `order_id` and its message; False when it was already committed."""
    attempt = 0
    while True:
        try:
            with Session(engine) as session, session.begin():
                session.execute(sa.insert(world.orders).values(
                    id=order_id, sku=f"SKU-{order_id % 7}", placed_at=time.time()))
                outbox.publish(session, world.TOPIC, {"order_id": order_id},
                               biz_type="order", biz_key=str(order_id), tags=world.TAGS)
            return True
        except IntegrityError:
            return False  # committed before (its answer was lost): one order, one message
        except DBAPIError as exc:
            log.warning("order %d: %s; retrying", order_id, str(exc.orig or exc).splitlines()[0])
            time.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults.producer")
    parser.add_argument("--orders", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="orders per second")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    url = os.environ["FAULTS_ORDERS_URL"]
    engine = sa.create_engine(url, pool_pre_ping=True, connect_args=world.connect_args(url))
    transport = kit.open_transport(os.environ["FAULTS_TRANSPORT"])
    dispatcher = kit.Dispatcher(engine, transport).start()
    outbox = kit.Outbox(engine, producer=world.PRODUCER, dispatcher=dispatcher)
    done = committed_ids(engine)
    todo = [i for i in range(1, args.orders + 1) if i not in done]
    print(f"producer: {len(done)} orders already committed, {len(todo)} to place", flush=True)
    interval = 1.0 / args.rate
    next_at = time.monotonic()
    placed = 0
    for order_id in todo:
        now = time.monotonic()
        if next_at > now:
            time.sleep(next_at - now)
        next_at = max(next_at, time.monotonic() - MAX_CATCH_UP) + interval
        placed += place(engine, outbox, order_id)
    dispatcher.close(timeout=10)
    transport.close()
    print(f"producer: placed {placed} orders", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
