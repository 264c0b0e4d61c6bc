"""RocketMQ 5 figures for both Python clients, against the 5.3.3 cluster of scripts/rocketmq5.sh.

    python bench/rocketmq5.py                       # every section
    python bench/rocketmq5.py --sections send,consume --messages 2000

The `rocketmq5://` transport (rocketmq-python-client 5.x, gRPC to the proxy) against its own raw
loops: the client's `Producer.send` loop vs `RocketMQ5Transport.send` vs the relay, and the
broker's own Java client (rocketmq-client 5.3.3 over remoting, bench/java/SendLoop.java) as the
physical-limit anchor; the client's `SimpleConsumer` receive+ack loop vs the transport consumer
(no-op) vs a decorated ConsumerApp; commit -> handler latency; consumer RSS. The old client
(`rocketmq://`, rocketmq-client-python 2.0.0) on the same 5.x broker is measured by
`python bench/rocketmq.py --addr 127.0.0.1:9886` (its name server).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.common import machine_facts, rss_mb, summary_us, table
from bench.rocketmq import (
    BODY,
    app_consume,
    commit_to_handler,
    consumer_rss,
    interleaved_rates,
    java_send,
    relay_send,
    tag,
    transport_consume,
    transport_send,
    wait_count,
)
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from consumer_kit.transports.rocketmq5 import client as v5client

SECTIONS = ("send", "consume", "latency", "rss")


def raw_send(endpoint: str, topic: str, n: int) -> tuple[float, list[float]]:
    """The 5.x client's own loop: one `Message` and one `Producer.send` per message."""
    lib = v5client.v5()
    producer = lib.Producer(v5client.configuration(endpoint, 3.0), (topic,))
    producer.startup()
    lat = []
    try:
        started = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            msg = lib.Message()
            msg.topic = topic
            msg.body = BODY
            msg.keys = f"id-{i}"
            msg.add_property("ckit_id", f"id-{i}")
            producer.send(msg)
            lat.append(time.perf_counter() - t0)
        return time.perf_counter() - started, lat
    finally:
        producer.shutdown()


def raw_consume(endpoint: str, topic: str, n: int, threads: int) -> float:
    """The 5.x client's own SimpleConsumer: receive up to 32, ack each, on `threads` threads."""
    lib = v5client.v5()
    # long polls of 2 s within requests of 10 s (the proxy refuses a poll its deadline cannot
    # cover: 40018)
    consumer = lib.SimpleConsumer(v5client.configuration(endpoint, 10.0), f"bench-raw-{tag()}",
                                  {topic: lib.FilterExpression("*")}, 2)
    consumer.startup()
    count = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                messages = consumer.receive(32, 30)
            except Exception:
                continue
            for message in messages or ():
                consumer.ack(message)
                with lock:
                    count[0] += 1

    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        return wait_count(count, n)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
        consumer.shutdown()


def send_section(transport: RocketMQ5Transport, engine: sa.engine.Engine, names: TableNames,
                 args: argparse.Namespace) -> None:
    n, topic = args.messages, f"BENCH5_SEND_{tag()}"
    transport.ensure_topic(topic)
    elapsed, lat = raw_send(args.endpoint, topic, n)
    base = n / elapsed
    rows = [["raw Producer.send loop (baseline)", f"{base:,.0f}", "1.00x", summary_us(lat)]]
    elapsed, lat = transport_send(transport, topic, n)
    rows.append(["RocketMQ5Transport.send", f"{n / elapsed:,.0f}",
                 f"{n / elapsed / base:.2f}x", summary_us(lat)])
    for workers in (1, 2):
        elapsed = relay_send(engine, names, lambda: RocketMQ5Transport(args.endpoint), topic, n,
                             workers)
        rows.append([f"Relay.run_once (batch 500, {workers} worker)", f"{n / elapsed:,.0f}",
                     f"{n / elapsed / base:.2f}x", ""])
    admin = RocketMQAdmin(args.namesrv)
    for threads in (1, 4):
        rate, what = java_send(admin, args.namesrv, topic, n, threads)
        rows.append([f"the broker's Java client, remoting, {threads} thread(s) ({what})",
                     f"{rate:,.0f}" if rate else "-", f"{rate / base:.2f}x" if rate else "-",
                     ""])
    print("\nsend (one process, synchronous sends)")
    print(table(["path", "msgs/s", "vs raw", "latency"], rows))


def consume_section(transport: RocketMQ5Transport, engine: sa.engine.Engine, names: TableNames,
                    args: argparse.Namespace) -> None:
    n, threads = args.messages, args.threads
    runs: list[tuple[str, Callable[[str], float]]] = [
        ("raw SimpleConsumer receive(32) + ack (baseline)",
         lambda t: raw_consume(args.endpoint, t, n, threads)),
        ("RocketMQ5Transport consumer, no-op",
         lambda t: transport_consume(transport, t, n, threads)),
        (f"ConsumerApp listener (Redis + {engine.dialect.name} dedupe, no-op handler)",
         lambda t: app_consume(transport, engine, names, t, n, threads, args.redis)[0]),
    ]
    rows, _ = interleaved_rates(transport, runs, n, args.repeat, "BENCH5_CONSUME")
    print(f"\nconsume {n:,} messages already on the broker (median of {args.repeat}, "
          f"{threads} threads)")
    print(table(["path", "msgs/s", "vs raw", "CPU us/msg", "runs (msgs/s)"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add, env = parser.add_argument, os.environ.get
    add("--endpoint", default=env("CKIT_TEST_ROCKETMQ5_PROXY", "127.0.0.1:8081"),
        help="the proxy's gRPC endpoint")
    add("--namesrv", default=env("CKIT_TEST_ROCKETMQ5_NAMESRV", "127.0.0.1:9886"))
    add("--url", default=env("CKIT_TEST_MYSQL_URL",
                             "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test"))
    add("--redis", default=env("CKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    add("--messages", type=int, default=5000)
    add("--latency-messages", type=int, default=300)
    add("--rss-messages", type=int, default=20_000)
    add("--threads", type=int, default=2)
    add("--repeat", type=int, default=1)
    add("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        parser.error(f"unknown section in {args.sections!r}: use {', '.join(SECTIONS)}")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HOME", tmp)
        engine = make_engine(args.url)
        names = TableNames(outbox=f"bench_{tag()}_outbox", receipts=f"bench_{tag()}_ack",
                           processed=f"bench_{tag()}_processed")
        metadata = build_metadata(names, include_transport=False)
        metadata.create_all(engine)
        url = f"rocketmq5://{args.endpoint}?namesrv={args.namesrv}"
        transport = RocketMQ5Transport(url, create_topics=True)
        try:
            print(machine_facts(engine))
            print(f"proxy   : {args.endpoint} (scripts/rocketmq5.sh, name server {args.namesrv}), "
                  f"{args.messages:,} messages of {len(BODY)} bytes per row")
            if "send" in sections:
                send_section(transport, engine, names, args)
            if "consume" in sections:
                consume_section(transport, engine, names, args)
            if "latency" in sections:
                lat = commit_to_handler(transport, engine, names, args.latency_messages)
                print(f"\ncommit -> handler ({len(lat)} of {args.latency_messages} one at a "
                      f"time): {summary_us(lat)}")
            if "rss" in sections:
                rows = consumer_rss(transport, args.rss_messages, args.threads)
                print(f"\nconsumer RSS (MiB), now {rss_mb():.1f}")
                print(table(["consumer", "messages", "before", "after", "growth"], rows))
        finally:
            transport.close()
            metadata.drop_all(engine)
            engine.dispose()
    print(f"\ncommand : python {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
