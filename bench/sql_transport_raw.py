"""Raw throughput of the SQL transport: sends/s, consumes/s, and both at once.

usage: python bench/sql_transport_raw.py [DB_URL] [--messages N] [--senders K] [--threads T]
       [--sqlite-synchronous FULL|NORMAL]

DB_URL defaults to a SQLite file in a temporary directory. On MariaDB the tables get a fresh
prefix and are dropped afterwards. Prints the command line and machine facts, then one line per
phase.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts
from consumer_kit.transports import ConsumeStatus, Delivery, OutgoingMessage, Subscription
from consumer_kit.transports.sql import SqlTransport


def send(transport: SqlTransport, topic: str, count: int, senders: int) -> float:
    started = time.monotonic()
    per = count // senders
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            for i in range(per):
                transport.send(OutgoingMessage(topic, f'{{"n": {n}, "i": {i}}}'.encode()))
        except BaseException as error:
            errors.append(error)
            raise

    threads = [threading.Thread(target=run, args=(n,)) for n in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"send failed: {errors[0]!r}")
    return time.monotonic() - started


def consume(transport: SqlTransport, topic: str, group: str, count: int, threads: int,
            while_sending: int = 0) -> tuple[float, float]:
    done = threading.Semaphore(0)

    def callback(_d: Delivery) -> ConsumeStatus:
        done.release()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(group, [Subscription(topic)], callback, threads=threads)
    started = time.monotonic()
    consumer.start()
    send_time = send(transport, topic, while_sending, 1) if while_sending else 0.0
    for _ in range(count):
        if not done.acquire(timeout=120):
            raise SystemExit("timed out waiting for deliveries")
    elapsed = time.monotonic() - started
    consumer.shutdown()
    return elapsed, send_time


def _consumer_process(url: str, prefix: str, topic: str, count: int, threads: int,
                      events: Any) -> None:
    with SqlTransport(url, table_prefix=prefix) as transport:
        done = threading.Semaphore(0)

        def callback(_d: Delivery) -> ConsumeStatus:
            done.release()
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = transport.consumer("bench_g3", [Subscription(topic)], callback,
                                      threads=threads)
        consumer.start()
        events.put("ready")
        for _ in range(count):
            done.acquire()
        events.put(time.monotonic())
        consumer.shutdown()


def across_processes(transport: SqlTransport, url: str, prefix: str, count: int,
                     threads: int) -> float:
    """One process sends while a consumer process receives; return end-to-end seconds."""
    topic = f"bench3_{uuid.uuid4().hex[:6]}"
    transport.ensure_topic(topic)
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    proc = ctx.Process(target=_consumer_process,
                       args=(url, prefix, topic, count, threads, events))
    proc.start()
    events.get(timeout=60)
    started = time.monotonic()
    send(transport, topic, count, 1)
    finished = events.get(timeout=120)
    proc.join(30)
    return float(finished) - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sqlite-synchronous", default="FULL")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    url = args.url or f"sqlite:///{tmp.name}/bench.db"
    prefix = "ckit_mq" if url.startswith("sqlite") else f"ckit_mq_b{uuid.uuid4().hex[:8]}"
    transport = SqlTransport(url, table_prefix=prefix, create_tables=True,
                             sqlite_synchronous=args.sqlite_synchronous)
    n = args.messages
    try:
        print(machine_facts(transport.db.engine))
        topic = f"bench_{uuid.uuid4().hex[:6]}"
        transport.ensure_topic(topic)
        t = send(transport, topic, n, 1)
        print(f"send, 1 thread:              {n / t:8.0f} msg/s")
        t = send(transport, topic, n, args.senders)
        print(f"send, {args.senders} threads:             {n / t:8.0f} msg/s")
        t, _ = consume(transport, topic, "bench_g1", 2 * n, args.threads)
        print(f"consume backlog, {args.threads} threads:   {2 * n / t:8.0f} msg/s")
        topic2 = f"bench2_{uuid.uuid4().hex[:6]}"
        transport.ensure_topic(topic2)
        t, _ = consume(transport, topic2, "bench_g2", n, args.threads, while_sending=n)
        print(f"send+consume, one process:   {n / t:8.0f} msg/s end to end "
              f"({2 * n / t:.0f} operations/s)")
        t = across_processes(transport, url, prefix, n, args.threads)
        print(f"send+consume, 2 processes:   {n / t:8.0f} msg/s end to end "
              f"({2 * n / t:.0f} operations/s)")
    finally:
        if not url.startswith("sqlite"):
            transport.tables.metadata.drop_all(transport.db.engine)
        transport.close()
        tmp.cleanup()


if __name__ == "__main__":
    main()
