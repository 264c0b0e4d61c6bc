"""Relay throughput (rows/s drained from the database to the memory transport) for several batch
sizes, and commit-to-send latency of the after-commit dispatcher.

    python bench/relay.py                                   # MariaDB from CKIT_TEST_MYSQL_URL
    python bench/relay.py --url sqlite:////tmp/relay.db --rows 20000

Baseline in the same run: batch size 1 (claim one row, send, mark: a naive poller). The anchor
from other frameworks: polling relays that take about 100 rows per 5 s sweep (20 rows/s).
Targets: >= 5,000 rows/s for one relay process; dispatcher p50 <= 5 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts, percentile, table
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import TableNames, build_metadata, outbox_table
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Dispatcher, Outbox, Relay
from outbox_producer.ids import new_message_id

DEFAULT_URL = os.environ.get("CKIT_TEST_MYSQL_URL",
                             "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test")


def fill(engine: sa.engine.Engine, table: sa.Table, n: int) -> None:
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(sa.delete(table))
    rows = [{"message_id": new_message_id(), "biz_type": "bench", "biz_key": str(i),
             "topic": "BENCH", "body": b'{"order_id":%d,"sku":"SKU-1","qty":1}' % i,
             "state": 0, "retry_count": 0, "max_retries": 10, "next_retry_at": now,
             "lock_version": 0, "created_by": "bench", "gmt_create": now, "gmt_modified": now}
            for i in range(n)]
    for start in range(0, n, 5000):
        with engine.begin() as conn:
            conn.execute(sa.insert(table), rows[start:start + 5000])


class TimedTransport(MemoryTransport):
    """Memory transport that records when each message was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: dict[str, float] = {}

    def send(self, message: OutgoingMessage) -> SendResult:
        result = super().send(message)
        self.sent_at[message.properties["ckit_id"]] = time.perf_counter()
        return result


def bench_relay(engine: sa.engine.Engine, names: TableNames, rows: int,
                runs: list[tuple[int, int]]) -> list[list[object]]:
    table = outbox_table(sa.MetaData(), names.outbox)
    out = []
    baseline = None
    for batch, workers in runs:
        n = min(rows, 2000) if batch == 1 else rows
        fill(engine, table, n)
        relay = Relay(engine, MemoryTransport(), table=names.outbox, batch=batch,
                      workers=workers)
        started = time.perf_counter()
        result = relay.run_once()
        elapsed = time.perf_counter() - started
        assert result.stats.sent == n, result
        rate = n / elapsed
        baseline = baseline or rate
        out.append([batch, workers, n, f"{elapsed:.2f}", f"{rate:,.0f}", f"{rate / baseline:.1f}x",
                    f"{rate / 20:,.0f}x"])
    return out


def bench_dispatcher(engine: sa.engine.Engine, names: TableNames, count: int) -> list[float]:
    transport = TimedTransport()
    dispatcher = Dispatcher(engine, transport, table=names.outbox).start()
    outbox = Outbox(engine, producer="bench", table=names.outbox, dispatcher=dispatcher)
    committed: dict[str, float] = {}
    try:
        for i in range(count):
            with Session(engine) as session:
                with session.begin():
                    mid = outbox.publish(session, "BENCH", {"i": i}, biz_type="lat",
                                         biz_key=f"{uuid.uuid4().hex}")
                committed[mid] = time.perf_counter()
            if i % 50 == 0:
                dispatcher.flush(10)
            else:
                time.sleep(0.001)  # a service commits now and then, not in a tight loop
        dispatcher.flush(30)
    finally:
        dispatcher.close()
    return [transport.sent_at[m] - t for m, t in committed.items() if m in transport.sent_at]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--runs", default="1x1,50x1,200x1,1000x1,200x2,500x2,500x3",
                        help="BATCHxWORKERS list; 1x1 is the naive baseline")
    parser.add_argument("--latency-count", type=int, default=1000)
    args = parser.parse_args()
    runs = [(int(b), int(w)) for b, w in (r.split("x") for r in args.runs.split(","))]
    engine = make_engine(args.url)
    names = TableNames(outbox=f"bench_{uuid.uuid4().hex[:6]}_outbox",
                       receipts=f"bench_{uuid.uuid4().hex[:6]}_ack")
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(engine)
    try:
        print(machine_facts(engine))
        print(f"\nrelay drain: one process, {args.rows:,} due rows -> memory transport "
              "(batch 1 = naive one-row poller, the in-run baseline; anchor = 20 rows/s)")
        print(table(["batch", "workers", "rows", "seconds", "rows/s", "vs batch 1", "vs anchor"],
                    bench_relay(engine, names, args.rows, runs)))
        lat = bench_dispatcher(engine, names, args.latency_count)
        print(f"\ndispatcher commit-to-send latency over {len(lat)} messages: "
              f"p50 {percentile(lat, 50) * 1000:.2f} ms, p99 {percentile(lat, 99) * 1000:.2f} ms, "
              f"max {max(lat) * 1000:.2f} ms")
    finally:
        metadata.drop_all(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
