"""End-to-end throughput over the SQL transport: publish (outbox) -> relay -> consume (dedupe,
one business INSERT, processed row in the same transaction), on SQLite and on MariaDB, with one
and two consumer processes.

    python bench/sql_transport.py [--messages 3000] [--backends sqlite,mariadb]

Each run: consumer processes start first (`ConsumerApp.run`, database-only dedupe); the main
process publishes N messages through the outbox in transactions of 50 and runs the relay; the
clock stops when N processed rows exist. Prints messages/s per configuration as a table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts, table
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata, processed_table
from consumer_kit.transports.sql import SqlTransport
from outbox_producer import Outbox, Relay

MYSQL = os.environ.get("CKIT_TEST_MYSQL_URL", "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test")
TOPIC = "BENCH_E2E"

CONSUMER = """
import os, signal, threading, sqlalchemy as sa
from consumer_kit import ConsumerApp
from consumer_kit.transports.sql import SqlTransport
env = os.environ
meta = sa.MetaData()
effects = sa.Table(env["B_EFFECTS"], meta, sa.Column("id", sa.Integer, primary_key=True),
                   sa.Column("n", sa.Integer, nullable=False))
transport = SqlTransport(env["B_MQ"], table_prefix=env["B_PREFIX"], poll_interval=0.01)
app = ConsumerApp(group="bench", db=env["B_DB"], redis=None, transport=transport, receipts=None,
                  processed_table=env["B_PROCESSED"], threads=int(env["B_THREADS"]))
@app.listener(env["B_TOPIC"])
def handle(msg, session):
    session.execute(sa.insert(effects).values(n=msg.json()["n"]))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=stop.set, daemon=True).start())
app.run(stop=stop, max_seconds=float(env["B_MAX"]))
app.close()
"""


def run_once(backend: str, consumers: int, messages: int, workdir: Path) -> float:
    tag = uuid.uuid4().hex[:6]
    if backend == "sqlite":
        db_url = f"sqlite:///{workdir / f'app-{tag}.db'}"
        mq_url = f"sqlite:///{workdir / f'mq-{tag}.db'}"
    else:
        db_url = mq_url = MYSQL
    names = TableNames(outbox=f"b{tag}_outbox", receipts=f"b{tag}_ack",
                       processed=f"b{tag}_processed")
    engine = make_engine(db_url)
    metadata = build_metadata(names, include_transport=False)
    effects = sa.Table(f"b{tag}_effects", metadata,
                       sa.Column("id", sa.Integer, primary_key=True),
                       sa.Column("n", sa.Integer, nullable=False))
    metadata.create_all(engine)
    prefix = f"b{tag}_mq"
    transport = SqlTransport(mq_url, table_prefix=prefix, create_tables=True)
    transport.ensure_topic(TOPIC)
    env = {**os.environ, "B_DB": db_url, "B_MQ": mq_url, "B_PREFIX": prefix,
           "B_PROCESSED": names.processed, "B_EFFECTS": effects.name, "B_TOPIC": TOPIC,
           "B_THREADS": "2", "B_MAX": "600", "PYTHONPATH": str(Path(__file__).parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", CONSUMER], env=env) for _ in range(consumers)]
    processed = processed_table(sa.MetaData(), names.processed)
    relay = Relay(engine, transport, table=names.outbox, batch=200, idle_sleep=0.05)
    relay_thread = threading.Thread(target=relay.run)
    try:
        time.sleep(2.0)  # consumers up and holding their queue leases
        started = time.perf_counter()
        outbox = Outbox(engine, producer="bench", table=names.outbox)
        relay_thread.start()
        for start in range(0, messages, 50):
            with engine.begin() as conn:
                for n in range(start, min(messages, start + 50)):
                    outbox.publish(conn, TOPIC, {"n": n}, biz_type="b", biz_key=str(n))
        deadline = time.monotonic() + 600
        done = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                done = int(conn.execute(sa.select(sa.func.count()).select_from(processed))
                           .scalar() or 0)
            if done >= messages:
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        with engine.connect() as conn:
            applied = conn.execute(sa.select(sa.func.count()).select_from(effects)).scalar()
        if done < messages or applied != messages:
            raise SystemExit(f"{backend}/{consumers}: processed {done}, effects {applied}, "
                             f"expected {messages}")
        return messages / elapsed
    finally:
        relay.stop()
        if relay_thread.is_alive():
            relay_thread.join(30)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        transport.close()
        if backend != "sqlite":
            metadata.drop_all(engine)
            with engine.begin() as conn:
                for t in sa.inspect(engine).get_table_names():
                    if t.startswith(prefix):
                        conn.execute(sa.text(f"DROP TABLE {t}"))
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--backends", default="sqlite,mariadb")
    args = parser.parse_args()
    print(machine_facts(make_engine(MYSQL) if "mariadb" in args.backends else None))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckit-bench-") as tmp:
        for backend in args.backends.split(","):
            for consumers in (1, 2):
                rate = run_once(backend, consumers, args.messages, Path(tmp))
                rows.append([backend, consumers, args.messages, f"{rate:,.0f}"])
                print(f"  {backend:8s} consumers={consumers}: {rate:,.0f} msg/s", flush=True)
    print("\nend to end: publish -> relay -> consume (dedupe + 1 INSERT), exactly-once checked")
    print(table(["backend", "consumer procs", "messages", "msg/s"], rows))


if __name__ == "__main__":
    main()
