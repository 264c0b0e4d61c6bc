"""Relays on the two nodes of a Galera cluster against relays on one node.

The same fresh backlog, drained run by run by:

- *one relay, node 1*: the baseline;
- *a relay on each node*: both claim the oldest due rows; the certification rolls back one
  claim of each pair that met (1213), whose relay claims again at once (`CLAIM_AGAIN_TIMES`);
- *a relay on each node, a lost claim waited out*: the same with `CLAIM_AGAIN_TIMES = 0`, as the
  relay was before: each lost claim is an outage, a warning and the doubling back-off from 0.5 s;
- *two relays, node 1*: row locks and SKIP LOCKED keep them apart without a conflict.

Each drain is `Relay.run_once()` on a thread per relay, to a transport whose send only counts;
it prints rows/s, what each relay sent, the claims lost, the outages waited out (each a
warning and a back-off) and the rows sent more than once (0, or the run is wrong). The cluster
is scripts/mariadb-galera.sh's (both nodes on this machine, so they and the relays share its
cores).

    python bench/galera_relays.py [--url URL] [--url2 URL2] [--rows 20000] [--batch 200] [--runs 3]

URLs default to CKIT_TEST_MYSQL_GALERA_URL and CKIT_TEST_MYSQL_GALERA_URL2 (.ckit-test.env).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_facts, parse_counts, table
from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import OutgoingMessage, SendResult
from consumer_kit.core.schema import outbox_table
from consumer_kit.transports.base import Transport
from outbox_producer import Outbox, Relay, metrics
from outbox_producer import relay as relay_module

MODES = {
    "one relay, node 1": (0,),
    "a relay on each node": (0, 1),
    "a relay on each node, a lost claim waited out": (0, 1),
    "two relays, node 1": (0, 0),
}


class CountingTransport(Transport):
    """Accepts every message and counts its sends per `ckit_id`."""

    scheme = "counting"

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.lock = threading.Lock()

    def send(self, message: OutgoingMessage) -> SendResult:
        with self.lock:
            self.sent[message.properties["ckit_id"]] += 1
            return SendResult(str(sum(self.sent.values())))

    def consumer(self, group: str, subscriptions: Any, callback: Any, *,
                 threads: int = 1) -> Any:
        raise NotImplementedError("the drain only sends")

    def dead_letters(self, group: str) -> list[Any]:
        return []


def fill(engine: sa.Engine, name: str, rows: int) -> None:
    outbox = Outbox(engine, producer="bench", table=name)
    for start in range(0, rows, 1000):
        with engine.begin() as conn:
            for k in range(start, min(rows, start + 1000)):
                outbox.publish(conn, "ORDER_CREATED", {"order_id": k}, biz_type="order",
                               biz_key=str(k))


def drain(engines: list[sa.Engine], name: str, mode: str, batch: int) -> dict[str, Any]:
    """Drain table `name` with the relays of `mode`, one per entry of MODES[mode] (a node's
    index in `engines`), each on its own thread."""
    transport = CountingTransport()
    sent: list[int] = []
    errors: list[int] = []
    lost_before = metrics.CLAIMS_LOST._value.get()
    again = relay_module.CLAIM_AGAIN_TIMES
    if mode.endswith("waited out"):
        relay_module.CLAIM_AGAIN_TIMES = 0
    try:
        relays = [Relay(engines[node], transport, table=name, batch=batch)
                  for node in MODES[mode]]
        def run(relay: Relay) -> None:
            result = relay.run_once()
            sent.append(result.stats.sent)
            errors.append(result.errors)  # outages waited out, each with a warning

        threads = [threading.Thread(target=run, args=(relay,)) for relay in relays]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    finally:
        relay_module.CLAIM_AGAIN_TIMES = again
    return {"elapsed": elapsed, "sent": sorted(sent, reverse=True),
            "lost": int(metrics.CLAIMS_LOST._value.get() - lost_before),
            "twice": sum(1 for n in transport.sent.values() if n > 1),
            "outages": sum(errors),
            "rows": len(transport.sent)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get(
        "CKIT_TEST_MYSQL_GALERA_URL", "mysql+pymysql://ckit:ckit@127.0.0.1:3309/ckit_galera"))
    parser.add_argument("--url2", default=os.environ.get(
        "CKIT_TEST_MYSQL_GALERA_URL2", "mysql+pymysql://ckit:ckit@127.0.0.1:3310/ckit_galera"))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200)
    args = parse_counts(parser, argv, "--rows", "--batch")
    engines = [make_engine(url) for url in (args.url, args.url2)]
    # (the check that node 2 has the backlog waits until it has applied node 1's commits)
    causal = make_engine(args.url2,
                         connect_args={"init_command": "SET SESSION wsrep_sync_wait = 1"})
    print(machine_facts(engines[0]))
    print(f"rows    : {args.rows:,} per drain, batch {args.batch}, {args.runs} runs; "
          f"CLAIM_AGAIN_TIMES {relay_module.CLAIM_AGAIN_TIMES}, "
          f"CLAIM_AGAIN_JITTER {relay_module.CLAIM_AGAIN_JITTER}s\n")
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    rows = []
    for run in range(1, args.runs + 1):
        for mode in MODES:
            name = f"bench_galera_{uuid.uuid4().hex[:8]}"
            t = outbox_table(sa.MetaData(), name)
            t.create(engines[0])
            try:
                fill(engines[0], name, args.rows)
                with causal.connect() as conn:  # node 2 has the backlog too
                    conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
                got = drain(engines, name, mode, args.batch)
            finally:
                t.drop(engines[0])
            if got["rows"] != args.rows or got["twice"]:
                print(f"error: {mode}: {got['rows']} of {args.rows} rows sent, "
                      f"{got['twice']} more than once", file=sys.stderr)
                return 1
            rate = args.rows / got["elapsed"]
            rates[mode].append(rate)
            rows.append([run, mode, f"{rate:,.0f}", "/".join(f"{n:,}" for n in got["sent"]),
                         got["lost"], got["outages"], got["twice"]])
    print(table(["run", "relays", "rows/s", "sent by each", "claims lost", "outages waited out",
                 "sent twice"], rows))
    base = statistics.median(rates["one relay, node 1"])
    print()
    print(table(["relays", "median rows/s", "x one relay"],
                [[mode, f"{statistics.median(r):,.0f}", f"{statistics.median(r) / base:.2f}x"]
                 for mode, r in rates.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
