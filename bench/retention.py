"""Relay throughput and publish latency while retention runs on a large outbox, against the same
load without retention (outside CI: it builds a 10,000,000-row table).

    python bench/retention.py                               # 10M rows in ckit_bench (MariaDB)
    python bench/retention.py --rows 1000000 --seconds 30   # a smaller run
    python bench/retention.py --reuse                       # keep the table of a previous run

The outbox is built fast by INSERT ... SELECT doubling: old CONSUMED rows, all archivable.
Each mode then puts a backlog of --backlog PENDING rows in, and for --seconds runs a relay
draining it (rows/s until the backlog is out, then it keeps up with the publisher) while a
publisher commits one message per transaction at --rate (publish latency p50/p99, over the
whole window), with one retention job beside them:

- none       no retention (the baseline of the ratios);
- archive    `ckit outbox archive` in key-ordered batches of --batch rows, --pause between them;
- delete     the delete storm it replaces: one DELETE of --storm-rows old rows;
- partition  a day-partitioned outbox of the same size (built the same way) whose old days
             `ckit outbox partitions rotate` archives and drops (DROP PARTITION, no deletes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts, percentile, table
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.transports.memory import MemoryTransport
from outbox_producer import Outbox, Relay, ops
from outbox_producer.ops import partitions as parts

DEFAULT_URL = os.environ.get("CKIT_BENCH_URL", "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_bench")
PLAIN = TableNames(outbox="bench_ret_outbox", receipts="bench_ret_receipt")
PARTED = TableNames(outbox="bench_ret_parted", receipts="bench_ret_parted_receipt")
OLD_DAYS = 40
BUILD_CHUNK = 250_000  # rows per INSERT ... SELECT: bounded transactions on a shared server
COLUMNS = ("message_id, biz_type, biz_key, topic, body, state, retry_count, max_retries, "
           "next_retry_at, sent_at, consumed_at, lock_version, created_by, updated_by, "
           "gmt_create, gmt_modified")


def build(engine: sa.Engine, names: TableNames, rows: int, *, partitioned: bool) -> float:
    """Create the outbox and fill it with `rows` old CONSUMED rows by doubling; seconds taken."""
    started = time.monotonic()
    old = utcnow() - dt.timedelta(days=OLD_DAYS)
    with engine.begin() as conn:
        for t in (names.outbox, f"{names.outbox}_key", names.receipts, names.outbox_archive):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {t}")
    tables = ops.OutboxTables.from_names(names)
    if partitioned:  # one partition per old day, the rows spread over the first ten of them
        parts.create(engine, tables, days_ahead=OLD_DAYS + 1, today=old.date())
    else:
        build_metadata(names, include_transport=False).create_all(engine)
    # message ids of row n fall on day n % 10 after `old` (ULID time prefixes), unique by n
    days = ", ".join(f"'{parts.ulid_floor(old + dt.timedelta(days=d))[:10]}'" for d in range(10))
    message_id = f"CONCAT(ELT(MOD(n, 10) + 1, {days}), LPAD(CONV(n, 10, 32), 16, '0'))"
    stamp = old.strftime("%Y-%m-%d %H:%M:%S")
    values = (f"{message_id}, 'bench', LPAD(n, 12, '0'), 'BENCH', "
              "'{\"order_id\": 1, \"sku\": \"SKU-1\", \"qty\": 1, \"pad\": \"0123456789abcdef\"}', "
              f"3, 0, 10, '{stamp}', '{stamp}', '{stamp}', 2, 'bench', 'bench', '{stamp}', "
              f"'{stamp}'")
    with engine.begin() as conn:
        if partitioned:  # the key table is the trigger's; filling it row by row would dominate
            conn.exec_driver_sql(f"DROP TRIGGER {names.outbox}_biz_key")
        conn.exec_driver_sql(f"INSERT INTO {names.outbox} ({COLUMNS}) SELECT {values} FROM "
                             "(SELECT 1 AS n) seed")
    have = 1
    while have < rows:  # double: copy the first `step` rows, in bounded transactions
        step = min(have, rows - have)
        copied, last = 0, 0
        while copied < step:
            chunk = min(BUILD_CHUNK, step - copied)
            # n numbers the new rows (auto-increment ids may have gaps)
            source = f"SELECT id FROM {names.outbox} WHERE id > {last} ORDER BY id LIMIT {chunk}"
            with engine.begin() as conn:
                last = int(conn.exec_driver_sql(f"SELECT MAX(id) FROM ({source}) x").scalar())
                conn.exec_driver_sql(
                    f"INSERT INTO {names.outbox} ({COLUMNS}) SELECT {values} FROM "
                    f"(SELECT ROW_NUMBER() OVER (ORDER BY id) + {have + copied} AS n "
                    f"FROM ({source}) x) s")
            copied += chunk
        have += step
        print(f"  built {have:,} rows ({time.monotonic() - started:.0f}s)", flush=True)
    if partitioned:
        with engine.begin() as conn:
            conn.exec_driver_sql(parts.key_trigger(names.outbox))
    return time.monotonic() - started


def backlog(engine: sa.Engine, names: TableNames, n: int) -> None:
    outbox = Outbox(engine, producer="bench", table=names.outbox)
    for start in range(0, n, 1000):
        with engine.begin() as conn:
            for i in range(start, min(n, start + 1000)):
                outbox.publish(conn, "BENCH", {"i": i}, biz_type="backlog",
                               biz_key=f"{time.time_ns()}-{i}")


def retired(engine: sa.Engine, names: TableNames) -> int:
    """Rows moved out of the outbox so far: the archive's size."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(names.outbox_archive):
            return 0
        return int(conn.exec_driver_sql(
            f"SELECT COUNT(*) FROM {names.outbox_archive}").scalar() or 0)


def retention(mode: str, url: str, names: TableNames, args: argparse.Namespace,
              stop: threading.Event, deleted: list[int]) -> None:
    """The retention job of `mode`, until `stop` (or nothing is left)."""
    engine = make_engine(url)
    tables = ops.OutboxTables.from_names(names)
    horizon = dt.timedelta(days=30)
    try:
        while not stop.is_set():
            if mode == "archive":
                if not ops.archive(engine, tables, horizon, batch=args.batch, pause=args.pause,
                                   max_batches=20).more:
                    return
            elif mode == "partition":
                if not parts.rotate(engine, tables, days_ahead=2, batch=args.batch,
                                    pause=args.pause, older_than=horizon, max_drops=1).dropped:
                    return
            elif mode == "delete":
                with engine.begin() as conn:
                    deleted.append(conn.execute(sa.text(
                        f"DELETE FROM {names.outbox} WHERE state = 3 AND gmt_modified < :c "
                        "LIMIT :n"), {"c": utcnow() - horizon, "n": args.storm_rows}).rowcount)
                return
    finally:
        engine.dispose()


def run_mode(mode: str, engine: sa.Engine, args: argparse.Namespace) -> dict[str, Any]:
    names = PARTED if mode == "partition" else PLAIN
    backlog(engine, names, args.backlog)
    relay = Relay(make_engine(args.url), MemoryTransport(), table=names.outbox, batch=500)
    stop = threading.Event()
    latencies: list[float] = []
    deleted: list[int] = []

    def publisher() -> None:
        outbox = Outbox(engine, producer="bench", table=names.outbox)
        i = 0
        started = time.monotonic()
        while not stop.is_set():
            t0 = time.monotonic()
            with Session(engine) as session, session.begin():
                outbox.publish(session, "BENCH", {"i": i}, biz_type="load",
                               biz_key=f"{mode}-{time.time_ns()}-{i}")
            latencies.append(time.monotonic() - t0)
            i += 1
            stop.wait(max(0.0, started + i / args.rate - time.monotonic()))

    before = retired(engine, names)
    threads = [threading.Thread(target=publisher)]
    if mode != "none":
        threads.append(threading.Thread(target=retention,
                                        args=(mode, args.url, names, args, stop, deleted)))
    for thread in threads:
        thread.start()
    started = time.monotonic()
    sent, drained = 0, None
    while time.monotonic() - started < args.seconds:
        result = relay.run(once=True, max_batches=10)
        sent += result.stats.sent
        if drained is None and sent >= args.backlog:  # the backlog is out: its drain rate
            drained = time.monotonic() - started
        if not result.stats.sent:
            time.sleep(0.05)
    elapsed = time.monotonic() - started
    stop.set()
    moved = retired(engine, names) - before + sum(deleted)  # as the window closed
    for thread in threads:
        thread.join()
    relay.engine.dispose()
    rate = args.backlog / drained if drained else sent / elapsed
    return {"relay_rows_s": rate, "publish_p50": percentile(latencies, 50),
            "publish_p99": percentile(latencies, 99), "publishes": len(latencies),
            "retention_rows": moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--reuse", action="store_true", help="keep the tables of a former run")
    parser.add_argument("--seconds", type=float, default=60.0, help="load time per mode")
    parser.add_argument("--backlog", type=int, default=20_000, help="PENDING rows per mode")
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second")
    parser.add_argument("--batch", type=int, default=1000, help="retention rows per batch")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between batches")
    parser.add_argument("--storm-rows", type=int, default=500_000,
                        help="rows of the one DELETE of mode `delete`")
    parser.add_argument("--modes", default="none,archive,delete,partition")
    args = parser.parse_args()
    engine = make_engine(args.url)
    print(machine_facts(engine))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for names, partitioned, wanted in ((PLAIN, False, {"none", "archive", "delete"} & set(modes)),
                                       (PARTED, True, {"partition"} & set(modes))):
        if wanted and not (args.reuse and sa.inspect(engine).has_table(names.outbox)):
            print(f"building {names.outbox}: {args.rows:,} rows")
            print(f"  {build(engine, names, args.rows, partitioned=partitioned):.0f}s")
    print(f"each mode: a backlog of {args.backlog:,} PENDING rows drained by one relay (batch "
          f"500) for {args.seconds:g}s while {args.rate:g} publishes/s commit; retention batch "
          f"{args.batch}, pause {args.pause * 1000:g} ms")
    results = {mode: run_mode(mode, engine, args) for mode in modes}
    base = results.get("none")
    rows = []
    for mode, r in results.items():
        rows.append([mode, f"{r['relay_rows_s']:,.0f}",
                     f"{r['relay_rows_s'] / base['relay_rows_s']:.2f}x" if base else "-",
                     f"{r['publish_p50'] * 1e3:.1f}", f"{r['publish_p99'] * 1e3:.1f}",
                     f"{r['publish_p99'] / base['publish_p99']:.2f}x" if base else "-",
                     f"{r['retention_rows']:,}"])
    print(table(["mode", "relay rows/s", "vs none", "publish p50 ms", "publish p99 ms",
                 "p99 vs none", "rows retired"], rows))


if __name__ == "__main__":
    main()
