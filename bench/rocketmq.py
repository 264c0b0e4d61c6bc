"""RocketMQ transport figures against the broker of scripts/rocketmq.sh: send rate (raw client vs
the transport vs the relay), consume rate (raw push consumer vs the transport vs a decorated
ConsumerApp, and that app with 1% poison messages mixed in), and RSS growth over many sends
(the 2.0.0 `Message` leak, and our fix).

    python bench/rocketmq.py                          # every section, the MariaDB test db
    python bench/rocketmq.py --sections consume,poison --repeat 3
    python bench/rocketmq.py --messages 20000 --url mysql+pymysql://ckit:ckit@127.0.0.1/ckit_test

Baselines in the same run: the raw rocketmq-client-python loop (`send_sync` with a new `Message`
each time, never freed, as its README does) and a raw PushConsumer with a no-op callback. With
`--repeat N` the consume rows are run N times, interleaved, and their medians printed.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as `python bench/rocketmq.py`, this file's folder comes first on sys.path and its name
# would shadow the `rocketmq` client package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import sqlalchemy as sa  # noqa: E402

from bench.common import machine_facts, rss_mb, summary_us, table  # noqa: E402
from consumer_kit.core.db import make_engine  # noqa: E402
from consumer_kit.core.schema import TableNames, build_metadata, outbox_table  # noqa: E402
from consumer_kit.transports import ConsumeStatus, OutgoingMessage, Subscription  # noqa: E402
from consumer_kit.transports.base import Transport  # noqa: E402
from consumer_kit.transports.rocketmq import RocketMQTransport, native  # noqa: E402
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin  # noqa: E402

BODY = b'{"order_id":12345,"sku":"SKU-1","qty":1,"note":"bench"}'
POISON_BODY = b'{"order_id":0,"sku":"POISON","qty":1,"note":"bench"}'
DEADLINE = 300.0
MIN_RATE = 100.0  # msgs/s: a consumer slower than this over a long run is a failure
POISON_DEADLINE = 120.0
POISON_RETRIES = 2  # the poison group's retryMaxTimes (the test broker's levels are all 1 s)
SECTIONS = ("send", "consume", "poison", "latency", "rss")


def tag() -> str:
    return uuid.uuid4().hex[:8]


def raw_send(addr: str, topic: str, n: int, *, free: bool, body: bytes = BODY
             ) -> tuple[float, list[float]]:
    client = native.client()
    producer = client.Producer(f"bench-raw-{tag()}")
    producer.set_name_server_address(addr)
    native.set_producer_instance_name(producer, native.new_instance_name("bench"))
    producer.start()
    lat = []
    try:
        started = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            msg = client.Message(topic)
            msg.set_keys(f"k{i}")
            msg.set_property("ckit_id", f"id-{i}")
            msg.set_body(body)
            producer.send_sync(msg)
            if free:
                native.destroy_message(msg)
            lat.append(time.perf_counter() - t0)
        return time.perf_counter() - started, lat
    finally:
        producer.shutdown()


def transport_send(transport: Transport, topic: str, n: int, body: bytes = BODY
                   ) -> tuple[float, list[float]]:
    lat = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        transport.send(OutgoingMessage(topic, body, keys=(f"id-{i}",),
                                       properties={"ckit_id": f"id-{i}", "ckit_src": "bench"}))
        lat.append(time.perf_counter() - t0)
    return time.perf_counter() - started, lat


def relay_send(engine: sa.engine.Engine, names: TableNames, open_target: Callable[[], Transport],
               topic: str, n: int, workers: int) -> float:
    """Seconds one `Relay.run_once` takes to send `n` pending rows to a transport of its own."""
    from consumer_kit.core.clock import utcnow
    from outbox_producer import Relay
    from outbox_producer.ids import new_message_id

    t = outbox_table(sa.MetaData(), names.outbox)
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(sa.delete(t))
        conn.execute(sa.insert(t), [
            {"message_id": new_message_id(), "biz_type": "bench", "biz_key": f"{workers}-{i}",
             "topic": topic, "body": BODY, "state": 0, "retry_count": 0, "max_retries": 10,
             "next_retry_at": now, "lock_version": 0, "created_by": "bench",
             "gmt_create": now, "gmt_modified": now} for i in range(n)])
    transport = open_target()
    try:
        relay = Relay(engine, transport, table=names.outbox, batch=500, workers=workers)
        started = time.perf_counter()
        result = relay.run_once()
        elapsed = time.perf_counter() - started
        assert result.stats.sent == n, result
        return elapsed
    finally:
        transport.close()


def fill_topic(transport: Transport, topic: str, n: int, poison_every: int = 0) -> None:
    transport.ensure_topic(topic)
    for i in range(n):
        poison = poison_every and i % poison_every == poison_every // 2
        transport.send(OutgoingMessage(topic, POISON_BODY if poison else BODY, keys=(f"c-{i}",),
                                       properties={"ckit_id": f"{topic}-{i}",
                                                   "ckit_src": "bench"}))


def wait_count(counter: list[int], n: int) -> float:
    """Seconds until `counter` reaches `n`; gives up after DEADLINE or, for large runs, the
    time of MIN_RATE messages per second."""
    started = time.perf_counter()
    limit = max(DEADLINE, n / MIN_RATE)
    while counter[0] < n and time.perf_counter() - started < limit:
        time.sleep(0.01)
    if counter[0] < n:
        raise RuntimeError(f"only {counter[0]} of {n} messages consumed in {limit:.0f} s")
    return time.perf_counter() - started


def raw_consume(addr: str, topic: str, n: int, threads: int) -> float:
    client = native.client()
    count = [0]
    lock = threading.Lock()

    def on_message(_msg: Any) -> Any:
        with lock:
            count[0] += 1
        return client.ConsumeStatus.CONSUME_SUCCESS

    consumer = client.PushConsumer(f"bench-raw-c-{tag()}")
    consumer.set_name_server_address(addr)
    consumer.set_instance_name(native.new_instance_name("bench"))
    consumer.set_thread_count(threads)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        return wait_count(count, n)
    finally:
        consumer.shutdown()


def transport_consume(transport: Transport, topic: str, n: int, threads: int) -> float:
    count = [0]
    lock = threading.Lock()

    def on_delivery(_delivery: Any) -> ConsumeStatus:
        with lock:
            count[0] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(f"bench-c-{tag()}", [Subscription(topic)], on_delivery,
                                  threads=threads)
    consumer.start()
    try:
        return wait_count(count, n)
    finally:
        consumer.shutdown()


def app_consume(transport: Transport, engine: sa.engine.Engine, names: TableNames,
                topic: str, n: int, threads: int, redis_url: str, poisoned: int = 0
                ) -> tuple[float, collections.Counter[str], int]:
    """A ConsumerApp (Redis + database dedupe) over `n` messages, `poisoned` of them always
    failing: seconds until every healthy one was applied, applies per id, dead letters."""
    from consumer_kit import ConsumerApp, Message

    group = f"bench-app-{tag()}"
    if poisoned:
        assert isinstance(transport, RocketMQTransport)
        transport.admin.prepare_group(group, retry_max_times=POISON_RETRIES)
    app = ConsumerApp(group=group, db=engine, redis=redis_url, receipts=None,
                      processed_table=names.processed, transport=transport, threads=threads)
    applied: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    @app.listener(topic)
    def handle(msg: Message, session: Any) -> None:
        if msg.json()["sku"] == "POISON":
            raise RuntimeError("poison message")
        with lock:
            applied[msg.id] += 1

    app.pipeline()
    consumer = transport.consumer(group, [Subscription(topic)], app.process, threads=threads)
    consumer.start()
    try:
        started = time.perf_counter()
        deadline = started + (POISON_DEADLINE if poisoned else DEADLINE)
        while len(applied) < n - poisoned and time.perf_counter() < deadline:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        dead = 0
        while poisoned and dead < poisoned and time.perf_counter() < deadline + 60:
            time.sleep(0.5)
            dead = len(transport.dead_letters(group))
        return elapsed, applied, dead
    finally:
        consumer.shutdown()
        app.close()


def poison_rows(transport: RocketMQTransport, engine: sa.engine.Engine, names: TableNames,
                n: int, threads: int, redis_url: str, base: float) -> list[list[object]]:
    """The ConsumerApp with 1% poison messages, against `base` (its success-path rate)."""
    topic, every = f"BENCH_POISON_{tag()}", 100
    fill_topic(transport, topic, n, poison_every=every)
    poisoned = sum(1 for i in range(n) if i % every == every // 2)
    elapsed, applied, dead = app_consume(transport, engine, names, topic, n, threads, redis_url,
                                         poisoned)
    rate = len(applied) / elapsed
    return [[f"ConsumerApp, {poisoned} poison of {n:,} (1%), retryMaxTimes {POISON_RETRIES}",
             f"{rate:,.0f}", f"{rate / base:.2f}x" if base else "-",
             f"{sum(1 for c in applied.values() if c == 1):,}/{n - poisoned:,}",
             sum(1 for c in applied.values() if c > 1), f"{dead}/{poisoned}"]]


def rss_growth(addr: str, topic: str, n: int, body_bytes: int) -> list[list[object]]:
    body = (b'{"pad":"' + b"x" * body_bytes)[:body_bytes - 2] + b'"}'
    before = rss_mb()
    raw_send(addr, topic, n, free=False, body=body)
    after_raw = rss_mb()
    raw_send(addr, topic, n, free=True, body=body)
    after_freed = rss_mb()
    transport = RocketMQTransport(addr, producer_group=f"bench-rss-{tag()}")
    try:
        transport_send(transport, topic, n, body)
    finally:
        transport.close()
    after_transport = rss_mb()
    return [["raw send_sync, Message never freed (2.0.0 as shipped)", n,
             f"{after_raw - before:+.1f}"],
            ["raw send_sync + DestroyMessage", n, f"{after_freed - after_raw:+.1f}"],
            ["RocketMQTransport.send", n, f"{after_transport - after_freed:+.1f}"]]


def commit_to_handler(transport: Transport, engine: sa.engine.Engine,
                      names: TableNames, n: int) -> list[float]:
    """Seconds from a business commit to the handler seeing the message (outbox -> dispatcher
    -> RocketMQ -> push consumer), one commit at a time."""
    from sqlalchemy.orm import Session

    from outbox_producer import Dispatcher, Outbox

    topic = f"BENCH_LAT_{tag()}"
    transport.ensure_topic(topic)
    arrived: dict[str, float] = {}

    def on_delivery(delivery: Any) -> ConsumeStatus:
        arrived[delivery.properties["ckit_id"]] = time.perf_counter()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(f"bench-lat-{tag()}", [Subscription(topic)], on_delivery,
                                  threads=2)
    consumer.start()
    dispatcher = Dispatcher(engine, transport, table=names.outbox).start()
    outbox = Outbox(engine, producer="bench", table=names.outbox, dispatcher=dispatcher)
    committed: dict[str, float] = {}
    try:
        time.sleep(3.0)  # the consumer's first rebalance
        for i in range(n):
            with Session(engine) as session:
                with session.begin():
                    mid = outbox.publish(session, topic, {"i": i}, biz_type="lat",
                                         biz_key=f"{tag()}-{i}")
                committed[mid] = time.perf_counter()
            time.sleep(0.005)
        deadline = time.monotonic() + 60
        while len(arrived) < n and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        dispatcher.close()
        consumer.shutdown()
    return [arrived[m] - t for m, t in committed.items() if m in arrived]


def consumer_rss(transport: Transport, n: int, threads: int) -> list[list[object]]:
    """RSS before and after a transport consumer takes `n` messages (fields copied out of each
    handle, as every consumer does)."""
    topic = f"BENCH_CRSS_{tag()}"
    fill_topic(transport, topic, n)
    before = rss_mb()
    elapsed = transport_consume(transport, topic, n, threads)
    after = rss_mb()
    return [[f"{type(transport).__name__} consumer ({n / elapsed:,.0f} msg/s)", f"{n:,}",
             f"{before:.1f}", f"{after:.1f}", f"{after - before:+.1f}"]]


def consume_rows(transport: RocketMQTransport, engine: sa.engine.Engine, names: TableNames,
                 args: argparse.Namespace) -> tuple[list[list[object]], float]:
    """Raw PushConsumer (baseline), transport no-op and ConsumerApp, `args.repeat` times
    interleaved; medians. Returns the rows and the ConsumerApp's median rate."""
    n, threads = args.messages, args.threads
    runs: list[tuple[str, Callable[[str], float]]] = [
        ("raw PushConsumer, no-op callback (baseline)",
         lambda t: raw_consume(args.addr, t, n, threads)),
        ("RocketMQTransport consumer, no-op",
         lambda t: transport_consume(transport, t, n, threads)),
        (f"ConsumerApp listener (Redis + {engine.dialect.name} dedupe, no-op handler)",
         lambda t: app_consume(transport, engine, names, t, n, threads, args.redis)[0]),
    ]
    return interleaved_rates(transport, runs, n, args.repeat, "BENCH_CONSUME")


def interleaved_rates(transport: Transport, runs: list[tuple[str, Callable[[str], float]]],
                      n: int, repeat: int, prefix: str) -> tuple[list[list[object]], float]:
    """Each run `repeat` times, interleaved, on a fresh topic of `n` messages: table rows with
    median rates against the first run (the baseline) and CPU per message, and the last run's
    median rate."""
    rates: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)  # less load-sensitive than rate
    for _ in range(repeat):
        for label, run in runs:
            topic = f"{prefix}_{tag()}"
            fill_topic(transport, topic, n)
            cpu_before = time.process_time()
            rates[label].append(n / run(topic))
            cpu[label].append((time.process_time() - cpu_before) / n * 1e6)
    base = statistics.median(rates[runs[0][0]])
    rows: list[list[object]] = [
        [label, f"{statistics.median(r):,.0f}", f"{statistics.median(r) / base:.3f}x",
         f"{statistics.median(cpu[label]):.0f}", " ".join(f"{x:,.0f}" for x in r)]
        for label, r in rates.items()]
    return rows, statistics.median(rates[runs[-1][0]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add, env = parser.add_argument, os.environ.get
    add("--addr", default=env("CKIT_TEST_ROCKETMQ", "127.0.0.1:9876"))
    add("--url", default=env("CKIT_TEST_MYSQL_URL",
                             "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test"),
        help="database for the outbox, the relay and the app (default: the MariaDB test db)")
    add("--redis", default=env("CKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    add("--latency-messages", type=int, default=500)
    add("--rss-messages", type=int, default=100_000, help="consumed for the consumer RSS figure")
    add("--messages", type=int, default=5000)
    add("--threads", type=int, default=2)
    add("--repeat", type=int, default=1, help="runs of each consume row (medians printed)")
    add("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    add("--rss-body-bytes", type=int, default=2048, help="body size for the RSS section")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the failing handlers of the poison section
    sections = set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        parser.error(f"unknown section in {args.sections!r}: use {', '.join(SECTIONS)}")
    n, threads = args.messages, args.threads
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("HOME", tmp)
        engine = make_engine(args.url)
        names = TableNames(outbox=f"bench_{tag()}_outbox", receipts=f"bench_{tag()}_ack",
                           processed=f"bench_{tag()}_processed")
        metadata = build_metadata(names, include_transport=False)
        metadata.create_all(engine)
        transport = RocketMQTransport(args.addr, producer_group=f"bench-{tag()}")
        try:
            print(machine_facts(engine))
            print(f"load    : {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)")
            print(f"broker  : {args.addr} (scripts/rocketmq.sh), {n:,} messages of "
                  f"{len(BODY)} bytes per row, {threads} consume threads")
            if "send" in sections:
                send_section(transport, engine, names, args)
            app_rate = 0.0
            if "consume" in sections:
                rows, app_rate = consume_rows(transport, engine, names, args)
                print(f"\nconsume {n:,} messages already on the broker (median of "
                      f"{args.repeat})")
                print(table(["path", "msgs/s", "vs raw", "CPU us/msg", "runs (msgs/s)"],
                            rows))
            if "poison" in sections:
                print("\nConsumerApp with poison messages (each fails every time); rate = "
                      "healthy messages applied per second until the last one")
                print(table(["path", "healthy/s", "vs success path", "applied once",
                             "applied twice+", "DLQ"],
                            poison_rows(transport, engine, names, n, threads, args.redis,
                                        app_rate)))
            if "latency" in sections:
                lat = commit_to_handler(transport, engine, names, args.latency_messages)
                print(f"\ncommit-to-handler latency through the after-commit dispatcher "
                      f"({len(lat)} messages, one commit at a time): {summary_us(lat)}")
            if "rss" in sections:
                print(f"\nconsumer RSS over {args.rss_messages:,} messages (MiB)")
                print(table(["consumer", "messages", "RSS before", "RSS after", "growth"],
                            consumer_rss(transport, args.rss_messages, threads)))
                topic = f"BENCH_RSS_{tag()}"
                transport.ensure_topic(topic)
                print(f"\nRSS growth while sending {args.rss_body_bytes}-byte bodies (MiB)")
                print(table(["path", "messages", "RSS growth MiB"],
                            rss_growth(args.addr, topic, n, args.rss_body_bytes)))
        finally:
            transport.close()
            metadata.drop_all(engine)
            engine.dispose()


def send_section(transport: RocketMQTransport, engine: sa.engine.Engine, names: TableNames,
                 args: argparse.Namespace) -> None:
    n, topic = args.messages, f"BENCH_SEND_{tag()}"
    transport.ensure_topic(topic)
    elapsed, lat = raw_send(args.addr, topic, n, free=False)
    base = n / elapsed
    rows = [["raw send_sync loop (baseline)", f"{base:,.0f}", "1.00x", summary_us(lat)]]
    elapsed, lat = transport_send(transport, topic, n)
    rows.append(["RocketMQTransport.send", f"{n / elapsed:,.0f}", f"{n / elapsed / base:.2f}x",
                 summary_us(lat)])
    for workers in (1, 2):
        elapsed = relay_send(engine, names, lambda: RocketMQTransport(
            args.addr, producer_group=f"bench-relay-{tag()}"), topic, n, workers)
        rows.append([f"Relay.run_once (batch 500, {workers} worker)", f"{n / elapsed:,.0f}",
                     f"{n / elapsed / base:.2f}x", ""])
    for threads in (1, 4):
        rate, what = java_send(transport.admin, transport.addr, topic, n, threads)
        rows.append([f"the broker's Java client, {threads} thread(s) ({what})",
                     f"{rate:,.0f}" if rate else "-", f"{rate / base:.2f}x" if rate else "-", ""])
    print("\nsend (one process, synchronous sends)")
    print(table(["path", "msgs/s", "vs raw", "latency"], rows))


def java_send(admin: RocketMQAdmin, addr: str, topic: str, n: int, threads: int
              ) -> tuple[float, str]:
    """The physical-limit anchor: bench/java/SendLoop.java on the client jar of the broker
    measured (found from the broker's `rocketmqHome`), compiled once into the cache. Returns
    (msgs/s, what ran) or (0, why not)."""
    masters = admin.master_brokers()
    home = admin.broker_config(next(iter(masters.values()))).get("rocketmqHome", "")
    lib = Path(home) / "lib"
    if not shutil.which("javac") or not list(lib.glob("rocketmq-client-*.jar")):
        return 0.0, f"skipped: no javac or no client jar under {lib}"
    version = next(lib.glob("rocketmq-client-*.jar")).stem.removeprefix("rocketmq-client-")
    classes = Path.home() / ".cache" / "consumer-kit" / f"bench-java-{version}"
    source = Path(__file__).resolve().parent / "java" / "SendLoop.java"
    if not (classes / "SendLoop.class").exists() or \
            (classes / "SendLoop.class").stat().st_mtime < source.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-cp", f"{lib}/*", "-d", str(classes), str(source)],
                       check=True, capture_output=True, timeout=300)
    out = subprocess.run(
        ["java", "-Xmx256m", "-cp", f"{lib}/*:{classes}", "SendLoop", addr, topic,
         str(n), str(threads), str(len(BODY))],
        capture_output=True, text=True, timeout=600).stdout
    found = re.search(r"sent \d+ in [\d.]+ s: (\d+) msg/s \((\d+) failed\)", out)
    if not found:
        return 0.0, "no result line"
    return float(found.group(1)), f"rocketmq-client {version}, {found.group(2)} failed"


if __name__ == "__main__":
    main()
