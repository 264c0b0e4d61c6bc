"""What delayed checks save against polling: relay queries per minute at idle and under load,
and commit-to-send latency, each mode measured in the same run.

    python bench/delayed_check.py                          # MariaDB from CKIT_TEST_MYSQL_URL
    python bench/delayed_check.py --seconds 30 --rate 100 --fail-every 10

Every mode runs the after-commit dispatcher (the hot path) and a safety net behind it; only the
safety net's queries to the outbox are counted (its own engines):

- polling   the relay polling every 0.5 s (the default --idle-sleep): the baseline;
- checks    the dispatcher schedules a delayed check for a batch it could not send, a Checker
            handles it; the relay polls every 60 s as the fallback;
- every     as checks, but a check for every batch before it is sent (seed 001's literal design).

Load: a publisher commits --rate messages per second, each in its own transaction; the first
send of every --fail-every-th message fails (so the safety net has work: the dispatcher's retry
waits for the back-off of 1 s). Latencies are from commit to the send that went through, for
the messages sent by the dispatcher at once (hot) and those the safety net re-sent (recovered).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts, percentile, table
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import TransportError
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import TableNames, build_metadata, outbox_table
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Backoff, Dispatcher, Outbox, Relay
from outbox_producer.checks import Checker

DEFAULT_URL = os.environ.get("CKIT_TEST_MYSQL_URL",
                             "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test")
CHECK_TOPIC = "ckit-check-bench"


class Broker(MemoryTransport):
    """Memory transport that fails the first send of every n-th message and times sends."""

    def __init__(self, fail_every: int) -> None:
        super().__init__()
        self.fail_every = fail_every
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}
        self.sent_at: dict[str, float] = {}
        self.checks = 0

    def send(self, message: OutgoingMessage) -> SendResult:
        mid = message.properties.get("ckit_id")
        if mid is None:
            with self.lock:
                self.checks += message.topic == CHECK_TOPIC
            return super().send(message)
        with self.lock:
            first = mid not in self.seen
            if first:
                self.seen[mid] = len(self.seen)
            fail = first and self.fail_every and self.seen[mid] % self.fail_every == 0
        if fail:
            raise TransportError("first send refused (bench)")
        result = super().send(message)
        with self.lock:
            self.sent_at.setdefault(mid, time.monotonic())
        return result


class Counter:
    """Counts the statements an engine sends to the outbox table."""

    def __init__(self, engine: sa.Engine, table: str) -> None:
        self.n = 0
        self.table = table
        sa.event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, conn: object, cursor: object, statement: str, *args: object) -> None:
        if self.table in statement:
            self.n += 1


def run_mode(mode: str, url: str, seconds: float, rate: float, fail_every: int,
             check_after: float | None) -> dict[str, float]:
    names = TableNames(outbox=f"bc{uuid.uuid4().hex[:8]}_outbox",
                       receipts=f"bc{uuid.uuid4().hex[:8]}_receipt")
    metadata = build_metadata(names, include_transport=False)
    app_engine = make_engine(url)
    metadata.create_all(app_engine)
    net_engine = make_engine(url)  # the safety net's own engine: only its queries are counted
    broker = Broker(fail_every)
    counter = Counter(net_engine, names.outbox)
    backoff = Backoff(schedule=(1.0, 5.0), jitter=0.0)
    dispatcher = Dispatcher(app_engine, broker, table=names.outbox, backoff=backoff,
                            check_topic=None if mode == "polling" else CHECK_TOPIC,
                            check_after=check_after, check_every_batch=mode == "every").start()
    relay = Relay(net_engine, broker, table=names.outbox, backoff=backoff,
                  idle_sleep=0.5 if mode == "polling" else 60.0)
    consumer = None
    if mode != "polling":
        checker = Checker(net_engine, outbox_table(sa.MetaData(), names.outbox), broker,
                          topic=CHECK_TOPIC, backoff=backoff)
        consumer = checker.consumer(broker)
        consumer.start()
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    time.sleep(1.0)  # let the relay's first poll and gauges pass
    result: dict[str, float] = {}
    try:
        # idle
        start_n, started = counter.n, time.monotonic()
        time.sleep(seconds)
        result["idle_q_min"] = (counter.n - start_n) / (time.monotonic() - started) * 60
        # load
        outbox = Outbox(app_engine, producer="bench", table=names.outbox, dispatcher=dispatcher)
        committed: dict[str, float] = {}
        start_n, started, checks0 = counter.n, time.monotonic(), broker.checks
        i = 0
        while time.monotonic() - started < seconds:
            with Session(app_engine) as session, session.begin():
                mid = outbox.publish(session, "BENCH", {"i": i}, biz_type="b", biz_key=str(i))
            committed[mid] = time.monotonic()
            i += 1
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
        result["load_q_min"] = (counter.n - start_n) / (time.monotonic() - started) * 60
        deadline = time.monotonic() + 90.0
        while len(broker.sent_at) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.1)
        result["check_msgs_min"] = (broker.checks - checks0) / seconds * 60
        hot = [broker.sent_at[m] - t for m, t in committed.items()
               if m in broker.sent_at and broker.seen[m] % fail_every]
        recovered = [broker.sent_at[m] - t for m, t in committed.items()
                     if m in broker.sent_at and not broker.seen[m] % fail_every]
        result.update(messages=len(committed), unsent=len(committed) - len(broker.sent_at),
                      hot_p50=percentile(hot, 50), hot_p99=percentile(hot, 99),
                      rec_p50=percentile(recovered, 50), rec_p99=percentile(recovered, 99))
    finally:
        relay.stop()
        thread.join(10)
        if consumer is not None:
            consumer.shutdown()
        dispatcher.close()
        metadata.drop_all(app_engine)
        app_engine.dispose()
        net_engine.dispose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=20.0, help="idle, then load, per mode")
    parser.add_argument("--rate", type=float, default=50.0, help="commits per second under load")
    parser.add_argument("--fail-every", type=int, default=10,
                        help="the first send of every n-th message fails")
    parser.add_argument("--check-after", type=float, default=None,
                        help="delay of a check (default: when the failed send's retry is due, "
                             "1 s here; 30 s for `every`)")
    args = parser.parse_args()
    print(machine_facts(make_engine(args.url)))
    print(f"each mode: {args.seconds:g} s idle, then {args.seconds:g} s at {args.rate:g} "
          f"commits/s; first send of every {args.fail_every}th message fails; checks after "
          f"{args.check_after or 'the default'} s; dispatcher retry back-off 1 s")
    results = {mode: run_mode(mode, args.url, args.seconds, args.rate, args.fail_every,
                              args.check_after) for mode in ("polling", "checks", "every")}
    base = results["polling"]
    rows = []
    for mode, r in results.items():
        rows.append([
            mode, f"{r['idle_q_min']:.0f}", f"{r['idle_q_min'] / base['idle_q_min']:.3f}x",
            f"{r['load_q_min']:.0f}", f"{r['load_q_min'] / base['load_q_min']:.2f}x",
            f"{r['check_msgs_min']:.0f}", f"{r['hot_p50'] * 1e3:.1f}/{r['hot_p99'] * 1e3:.1f}",
            f"{r['rec_p50'] * 1e3:.0f}/{r['rec_p99'] * 1e3:.0f}",
            f"{r['rec_p50'] / base['rec_p50']:.2f}x", f"{r['messages']:.0f}/{r['unsent']:.0f}"])
    print(table(["mode", "idle q/min", "vs poll", "load q/min", "vs poll", "checks/min",
                 "hot ms p50/p99", "recovered ms p50/p99", "rec p50 vs poll", "msgs/unsent"],
                rows))


if __name__ == "__main__":
    main()
