"""Benchmark `ckit reconcile` on MariaDB: a 1% stuck window in a 1M-row, then a 10M-row outbox.

    python bench/reconcile.py                       # 1M, then the same window inside 10M
    python bench/reconcile.py --rows 1000000 --big-rows 0     # 1M only
    python bench/reconcile.py --reuse               # keep tables from a previous run
    python bench/reconcile.py --only-ack-index      # only step 5 (a throwaway table)
    python bench/reconcile.py --only-schema-explain # only step 6 (a throwaway table)

What it does:

1. Creates `bench_outbox`, `bench_ack`, `bench_processed` in database `ckit_bench` and fills them
   with INSERT ... SELECT from MariaDB's sequence engine (`seq_A_to_B`) in chunks: every
   `--step`-th row (1%) is SENT an hour ago (70% processed SUCCEEDED: ack lost, 10% FAILED:
   rejected, 20% never processed: retry); every other row is CONSUMED days ago with a processed
   row. The stuck ids are spread over the whole id range (the worst case for id partitioning).
   The processed and ack tables are shared; each size has its own outbox table
   (`bench_outbox_<rows>`), so `--reuse` keeps both sizes between runs.
2. The `--big-rows` table holds the same window (ids up to `--rows`) plus CONSUMED rows up to
   `--big-rows`: the same window inside a table ten times larger.
3. Runs `ckit reconcile --engine spark` (a fresh process: wall time includes the JVM and Spark
   start) and `ckit reconcile --engine sql` `--repeat` times per table, resetting the window before
   each run, and reports the median (and the minimum) wall time.
4. Prints machine facts, the command lines, per run the repair statements, rows read per source
   and (Spark) the window bounds and partitions, EXPLAIN of the window reads, and a comparison
   table.
5. The ack index of the large-window read: fills a throwaway `explain_ack` with 1,000,000 ack rows
   over 30 days (two groups) from `seq_1_to_1000000`, prints EXPLAIN of one group's last day and
   times that query with the index and with `IGNORE INDEX`, then drops the table.
6. EXPLAIN of the other outbox queries (relay, stats, show, retry, archive) on a throwaway
   `explain_outbox` of 20,000 rows in every state: the output `schema/README.md` quotes.
Targets: Spark on 1M <= 60 s wall; 10M <= 1.2x the 1M time (cost follows the window).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_facts
from consumer_kit.core.clock import utcnow
from consumer_kit.core.schema import outbox_table, processed_table, receipt_table
from consumer_kit.core.urls import mask_text

DEFAULT_URL = "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_bench"
ACK, PROCESSED = "bench_ack", "bench_processed"
GROUP = "inventory"
CHUNK = 250_000
STUCK_AGE = dt.timedelta(hours=1)
CONSUMED_AGE = dt.timedelta(days=3)
#: Step 5: a throwaway ack table of ACK_INDEX_ROWS rows spread over ACK_INDEX_SPAN, two groups.
ACK_INDEX_TABLE = "explain_ack"
ACK_INDEX_ROWS = 1_000_000
ACK_INDEX_SPAN = dt.timedelta(days=30)
ACK_INDEX_TIMINGS = 5
#: Step 6: a throwaway outbox in every state for the EXPLAIN output `schema/README.md` quotes.
SCHEMA_EXPLAIN_TABLE = "explain_outbox"
SCHEMA_EXPLAIN_ROWS = 20_000


def outbox_name(rows: int) -> str:
    """One outbox table per size, so both sizes can be reused across runs."""
    return f"bench_outbox_{rows}"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def create_tables(engine: sa.Engine, outbox: str, *, shared: bool) -> None:
    meta = sa.MetaData()
    tables = [outbox_table(meta, outbox)]
    if shared:
        tables += [receipt_table(meta, ACK), processed_table(meta, PROCESSED)]
    for t in tables:
        t.drop(engine, checkfirst=True)
    meta.create_all(engine, tables=tables)


def fill_outbox(engine: sa.Engine, outbox: str, start: int, end: int, step: int,
                stuck_max: int, now: dt.datetime) -> None:
    """Rows `start..end` (id = sequence number); SENT an hour ago when `id % step = 0 AND
    id <= stuck_max`, else CONSUMED days ago."""
    for a in range(start, end + 1, CHUNK):
        b = min(end, a + CHUNK - 1)
        began = time.monotonic()
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO {outbox} (id, message_id, biz_type, biz_key, topic, body, state, "
                "retry_count, max_retries, next_retry_at, sent_at, consumed_at, lock_version, "
                "created_by, updated_by, gmt_create, gmt_modified) "
                "SELECT seq, CONCAT('m', LPAD(seq, 12, '0')), 'ORDER_CREATED', CONCAT('k', seq), "
                "'ORDER', '{}', IF(s, 2, 3), 0, 3, IF(s, :st, ts), IF(s, :st, ts), "
                "IF(s, NULL, ts + INTERVAL 1 SECOND), 1, 'orders', 'relay', "
                "IF(s, :st - INTERVAL 1 SECOND, ts), IF(s, :st, ts) "
                "FROM (SELECT seq, (seq % :step = 0 AND seq <= :stuck_max) AS s, "
                ":base + INTERVAL (seq * 10000) MICROSECOND AS ts "
                f"FROM seq_{a}_to_{b}) g"),
                {"st": now - STUCK_AGE, "base": now - CONSUMED_AGE, "step": step,
                 "stuck_max": stuck_max})
        log(f"{outbox} rows {a}..{b} in {time.monotonic() - began:.1f}s")
    with engine.begin() as conn:
        conn.execute(sa.text(f"ANALYZE TABLE {outbox}"))


def fill_processed(engine: sa.Engine, rows: int, step: int, now: dt.datetime) -> None:
    """Processed rows for every consumed message of the first `rows` ids and 80% of the stuck
    ones (one in ten stuck FAILED: rejected; two in ten never processed: retry)."""
    for a in range(1, rows + 1, CHUNK):
        b = min(rows, a + CHUNK - 1)
        began = time.monotonic()
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO {PROCESSED} (consumer_group, message_id, topic, src, status, "
                "attempts, error, first_seen_at, processed_at) "
                f"SELECT '{GROUP}', CONCAT('m', LPAD(seq, 12, '0')), 'ORDER', 'orders', "
                "IF(s AND k = 7, 'FAILED', 'SUCCEEDED'), 1, IF(s AND k = 7, 'bad payload', NULL), "
                "IF(s, :st, ts), IF(s, :st, ts) "
                "FROM (SELECT seq, (seq % :step = 0) AS s, (seq DIV :step) % 10 AS k, "
                ":base + INTERVAL (seq * 10000 + 2000000) MICROSECOND AS ts "
                f"FROM seq_{a}_to_{b}) g WHERE NOT (s AND k >= 8)"),
                {"st": now - STUCK_AGE + dt.timedelta(seconds=1), "base": now - CONSUMED_AGE,
                 "step": step})
        log(f"processed rows {a}..{b} in {time.monotonic() - began:.1f}s")


def reset_window(engine: sa.Engine, outbox: str, rows: int, step: int, now: dt.datetime) -> None:
    """Put the window back as the fill left it (SENT an hour ago) and drop inserted acks."""
    t = outbox_table(sa.MetaData(), outbox)
    ids = list(range(step, rows + 1, step))
    stuck_ts = now - STUCK_AGE
    with engine.begin() as conn:
        for i in range(0, len(ids), 5000):
            conn.execute(sa.update(t).where(t.c.id.in_(ids[i : i + 5000])).values(
                state=2, retry_count=0, max_retries=3, next_retry_at=stuck_ts, sent_at=stuck_ts,
                consumed_at=None, fail_reason=None, lock_version=1, updated_by="relay",
                gmt_modified=stuck_ts))
        conn.execute(sa.text(f"DELETE FROM {ACK}"))


def run_ckit(url: str, outbox: str, engine_name: str,
             out_dir: str) -> tuple[float, dict[str, Any], str]:
    cmd = ["ckit", "reconcile", "--engine", engine_name, "--url", url,
           "--group", f"{GROUP}={url}", "--outbox-table", outbox, "--receipt-table", ACK,
           "--processed-table", PROCESSED, "--output", out_dir, "--json", "--quiet",
           "--no-fail-on-failures"]
    shown = mask_text(shlex.join(cmd))
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"{shown} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout), shown


def sql_literal(value: dt.datetime) -> str:
    return value.strftime("'%Y-%m-%d %H:%M:%S.%f'")


def explain(engine: sa.Engine, outbox: str, now: dt.datetime) -> str:
    """EXPLAIN of the reconciler's window reads on the benchmark's outbox table `outbox`."""
    cutoff = sql_literal(now - dt.timedelta(minutes=10))
    cols = ("id, message_id, topic, state, retry_count, max_retries, lock_version, sent_at, "
            "lease_until")
    window = {
        "bounds of the SENT window (min/max id, count, oldest sent_at)":
            f"SELECT MIN(id), MAX(id), COUNT(*), MIN(sent_at) FROM {outbox} "
            f"WHERE state = 2 AND sent_at < {cutoff}",
        "one partition of the Spark window read (as Spark's JDBC source sends it)":
            f"SELECT {cols} FROM (SELECT {cols} FROM {outbox} WHERE state = 2 AND sent_at < "
            f"{cutoff}) w WHERE id >= 5000000 AND id < 10000001",
        "the SENDING part of the window":
            f"SELECT {cols} FROM {outbox} WHERE state = 1 AND lease_until < {cutoff}",
        "the SQL engine's window id scan":
            f"SELECT id FROM {outbox} WHERE state = 2 AND sent_at < {cutoff}",
        "processed rows by a chunked IN predicate":
            f"SELECT message_id, status, error FROM {PROCESSED} WHERE consumer_group = '{GROUP}' "
            "AND message_id IN ('m000000000100', 'm000000000200')",
    }
    lines: list[str] = []
    with engine.connect() as conn:
        for title, q in window.items():
            lines += explain_lines(conn, title, q)
    return "\n".join(lines)


def schema_explain(engine: sa.Engine, now: dt.datetime) -> str:
    """Step 6: EXPLAIN of the other outbox queries `schema/README.md` quotes, on a throwaway
    `explain_outbox` of 20,000 rows over 30 days in every state, ten topics, nine biz types."""
    t = outbox_table(sa.MetaData(), SCHEMA_EXPLAIN_TABLE)
    t.drop(engine, checkfirst=True)
    t.create(engine)
    try:
        step_us = int(dt.timedelta(days=30).total_seconds() * 1_000_000) // SCHEMA_EXPLAIN_ROWS
        with engine.begin() as conn:
            # k = seq % 20: 0 PENDING (due), 1 SENT, 2 FAILED, 3 REJECTED, 4 SUSPENDED, else
            # CONSUMED; ids grow with gmt_create, as they do in production.
            conn.execute(sa.text(
                f"INSERT INTO {SCHEMA_EXPLAIN_TABLE} (id, message_id, biz_type, biz_key, topic, "
                "body, state, retry_count, max_retries, next_retry_at, sent_at, consumed_at, "
                "lock_version, created_by, updated_by, gmt_create, gmt_modified) "
                "SELECT seq, CONCAT('m', LPAD(seq, 12, '0')), CONCAT('T', (seq DIV 7) % 9), "
                "CONCAT('k', seq), CONCAT('topic', (seq DIV 20) % 10), '{}', "
                "ELT(k + 1, 0, 2, 4, 5, 6, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3), 0, 3, "
                "ts, IF(k = 0, NULL, ts + INTERVAL 1 SECOND), "
                "IF(k >= 5, ts + INTERVAL 2 SECOND, NULL), 1, 'orders', 'relay', ts, "
                "ts + INTERVAL 2 SECOND "
                "FROM (SELECT seq, seq % 20 AS k, :base + INTERVAL (seq * :step_us) MICROSECOND "
                f"AS ts FROM seq_1_to_{SCHEMA_EXPLAIN_ROWS}) g"),
                {"base": now - dt.timedelta(days=30), "step_us": step_us})
            conn.execute(sa.text(f"ANALYZE TABLE {SCHEMA_EXPLAIN_TABLE}"))
        outbox = SCHEMA_EXPLAIN_TABLE
        horizon = sql_literal(now - dt.timedelta(days=14))
        queries = {
            "relay: due rows":
                f"SELECT id FROM {outbox} WHERE state = 0 AND next_retry_at <= "
                f"{sql_literal(now)} ORDER BY next_retry_at LIMIT 100",
            "reconciler: the SENT window":
                f"SELECT id FROM {outbox} WHERE state = 2 AND sent_at < "
                f"{sql_literal(now - dt.timedelta(minutes=10))}",
            "stats: rows per state (an index-only scan; no table rows read)":
                f"SELECT state, COUNT(*) FROM {outbox} GROUP BY state",
            "stats: sent-to-consumed lag over the last hour (bounded by LIMIT)":
                f"SELECT sent_at, consumed_at FROM {outbox} WHERE state = 3 AND sent_at >= "
                f"{sql_literal(now - dt.timedelta(hours=1))} ORDER BY sent_at DESC LIMIT 10000",
            "ack applier / show by message id: a unique-key lookup (const)":
                f"SELECT * FROM {outbox} WHERE message_id = 'm000000000100'",
            "show by biz key: the (few) biz types first, a loose index scan":
                f"SELECT biz_type FROM {outbox} GROUP BY biz_type",
            "show by biz key: then the key under each type, a range":
                f"SELECT * FROM {outbox} WHERE biz_type IN ('T0','T1','T2','T3','T4') "
                "AND biz_key = 'k7'",
            "bulk retry by state and topic":
                f"SELECT id FROM {outbox} WHERE state IN (4) AND topic = 'topic3' ORDER BY id "
                "LIMIT 1000",
            "archive --older-than 14d: one batch (the oldest rows first on the primary key)":
                f"SELECT id FROM {outbox} WHERE state IN (3, 5) AND gmt_modified < {horizon} "
                f"AND gmt_create < {horizon} AND id > 0 ORDER BY id LIMIT 1000",
        }
        lines = [f"{SCHEMA_EXPLAIN_TABLE}: {SCHEMA_EXPLAIN_ROWS:,} rows over 30 days, "
                 "ANALYZE TABLE done", ""]
        with engine.connect() as conn:
            for title, q in queries.items():
                lines += explain_lines(conn, title, q)
        return "\n".join(lines)
    finally:
        t.drop(engine, checkfirst=True)


def explain_lines(conn: sa.Connection, title: str, query: str) -> list[str]:
    """`-- title`, the statement, and EXPLAIN's rows as `a | b | ...`."""
    result = conn.execute(sa.text("EXPLAIN " + query))
    lines = [f"-- {title}", f"EXPLAIN {query};", " | ".join(result.keys())]
    lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in result]
    return [*lines, ""]


def ack_index(engine: sa.Engine, now: dt.datetime) -> str:
    """Step 5: EXPLAIN and timings of the large-window ack read on a throwaway 1M-row table."""
    table = receipt_table(sa.MetaData(), ACK_INDEX_TABLE)
    index = f"ix_{ACK_INDEX_TABLE}_group_acked"
    table.drop(engine, checkfirst=True)
    table.create(engine)
    try:
        began = time.monotonic()
        step_us = int(ACK_INDEX_SPAN.total_seconds() * 1_000_000) // ACK_INDEX_ROWS
        with engine.begin() as conn:
            conn.execute(sa.text(
                f"INSERT INTO {ACK_INDEX_TABLE} (message_id, consumer_group, outcome, reason, "
                "received_at) SELECT CONCAT('m', LPAD(seq, 12, '0')), "
                f"IF(seq % 2 = 0, '{GROUP}', 'billing'), 'consumed', NULL, "
                ":base + INTERVAL (seq * :step_us) MICROSECOND "
                f"FROM seq_1_to_{ACK_INDEX_ROWS}"),
                {"base": now - ACK_INDEX_SPAN, "step_us": step_us})
            conn.execute(sa.text(f"ANALYZE TABLE {ACK_INDEX_TABLE}"))
        lines = [f"{ACK_INDEX_TABLE}: {ACK_INDEX_ROWS:,} ack rows over "
                 f"{ACK_INDEX_SPAN.days} days, groups {GROUP} and billing, filled in "
                 f"{time.monotonic() - began:.1f}s", ""]
        since = sql_literal(now - dt.timedelta(days=1))
        where = f"WHERE consumer_group IN ('{GROUP}') AND received_at >= {since}"
        query = (f"SELECT message_id, consumer_group, outcome, reason, received_at "
                 f"FROM {ACK_INDEX_TABLE} {where}")
        ignored = query.replace(f"FROM {ACK_INDEX_TABLE} ",
                                f"FROM {ACK_INDEX_TABLE} IGNORE INDEX ({index}) ")
        with engine.connect() as conn:
            lines += explain_lines(conn, "acks of the large-window path: one group's last day",
                                   query)
            lines += explain_lines(conn, "the same without the index (a full scan)", ignored)
            for label, q in ((f"with {index}", query), ("with IGNORE INDEX", ignored)):
                rows, took = time_query(conn, q)
                lines.append(f"{label}: {rows:,} rows in {took * 1000:.0f} ms "
                             f"(median of {ACK_INDEX_TIMINGS} runs)")
        return "\n".join(lines)
    finally:
        table.drop(engine, checkfirst=True)


def time_query(conn: sa.Connection, query: str) -> tuple[int, float]:
    """Rows of `query` and the median seconds to fetch them all (after one warm-up run)."""
    conn.execute(sa.text(query)).all()
    walls = []
    for _ in range(ACK_INDEX_TIMINGS):
        began = time.monotonic()
        rows = len(conn.execute(sa.text(query)).all())
        walls.append(time.monotonic() - began)
    return rows, statistics.median(walls)


def spark_facts(engine: sa.Engine) -> str:
    """The line `bench.common.machine_facts` lacks here: pyspark, Java, InnoDB buffer pool."""
    import pyspark

    with engine.connect() as conn:
        pool = conn.execute(sa.text("SELECT @@innodb_buffer_pool_size")).scalar()
    java = subprocess.run(["java", "-version"], capture_output=True, text=True,
                          check=False).stderr.splitlines()
    return (f"spark   : pyspark {pyspark.__version__}, {java[0] if java else 'java ?'}, "
            f"innodb_buffer_pool_size {int(pool or 0) // (1024 * 1024)} MiB")


def count(engine: sa.Engine, table: str) -> int:
    if not sa.inspect(engine).has_table(table):
        return -1
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("CKIT_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--big-rows", type=int, default=10_000_000,
                        help="a second table with the same window and this many rows (0: skip)")
    parser.add_argument("--step", type=int, default=100, help="every STEP-th row is stuck (1%%)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per engine and table")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse tables that already hold the right number of rows")
    parser.add_argument("--out", default="ckit-out/bench-reconcile")
    parser.add_argument("--only-ack-index", action="store_true",
                        help="run only step 5, the ack index on a throwaway 1M-row table")
    parser.add_argument("--only-schema-explain", action="store_true",
                        help="run only step 6, EXPLAIN of the outbox queries on a throwaway table")
    args = parser.parse_args()
    engine = sa.create_engine(args.url)
    now = utcnow()
    print("# ckit reconcile benchmark")
    print(machine_facts(engine))
    print(spark_facts(engine))
    if args.only_ack_index or args.only_schema_explain:
        if args.only_ack_index:
            print("\n## ack index of the large-window read\n" + ack_index(engine, now))
        if args.only_schema_explain:
            print("\n## EXPLAIN of the outbox queries (schema/README.md)\n"
                  + schema_explain(engine, now))
        return

    sizes = [args.rows] + ([args.big_rows] if args.big_rows > args.rows else [])
    fresh = not args.reuse or count(engine, PROCESSED) < 0
    if fresh:
        create_tables(engine, outbox_name(args.rows), shared=True)
        began = time.monotonic()
        fill_processed(engine, args.rows, args.step, now)
        print(f"populated {count(engine, PROCESSED)} processed rows in "
              f"{time.monotonic() - began:.1f}s")
    for index in receipt_table(sa.MetaData(), ACK).indexes:  # tables reused from older versions
        index.create(engine, checkfirst=True)
    for size in sizes:
        name = outbox_name(size)
        if not args.reuse or count(engine, name) != size:
            began = time.monotonic()
            create_tables(engine, name, shared=False)
            fill_outbox(engine, name, 1, size, args.step, args.rows, now)
            print(f"populated {name}: {size} rows in {time.monotonic() - began:.1f}s")

    results: list[tuple[int, str, list[float], dict[str, Any]]] = []
    for size in sizes:
        for engine_name in ("spark", "sql"):
            walls: list[float] = []
            for _ in range(args.repeat):
                reset_window(engine, outbox_name(size), args.rows, args.step, utcnow())
                wall, summary, shown = run_ckit(args.url, outbox_name(size), engine_name, args.out)
                walls.append(wall)
                print(f"\n$ {shown}\n  {size} rows: wall {wall:.1f}s, window "
                      f"{summary['window_rows']}, statements {summary['statements']}, rows read "
                      f"{sum(summary['rows_read'].values())} {summary['rows_read']}\n"
                      f"  durations {summary['durations_s']}", flush=True)
                details = summary["details"]
                if "bounds" in details:
                    print(f"  bounds {details['bounds']}, window partitions "
                          f"{details.get('window_partitions')}, evidence read "
                          f"{details.get('evidence_read')}", flush=True)
            results.append((size, engine_name, walls, summary))
    reset_window(engine, outbox_name(sizes[-1]), args.rows, args.step, utcnow())
    print("\n## EXPLAIN (MariaDB)\n" + explain(engine, outbox_name(sizes[-1]), utcnow()))
    print("## ack index of the large-window read\n" + ack_index(engine, utcnow()) + "\n")
    print("## EXPLAIN of the outbox queries (schema/README.md)\n"
          + schema_explain(engine, utcnow()))
    report(results, sizes)


def report(results: list[tuple[int, str, list[float], dict[str, Any]]], sizes: list[int]) -> None:
    print("## results (wall time of the whole `ckit reconcile` process, median of the runs)")
    print(f"{'table rows':>11} {'engine':>6} {'median s':>8} {'min s':>6} {'window':>7} "
          f"{'rows read':>10} {'rows/s':>8} {'receipt_lost':>8} {'rejected':>8} {'retry':>6} "
          f"{'conflicts':>9}")
    medians: dict[tuple[int, str], float] = {}
    for size, name, walls, s in results:
        med = statistics.median(walls)
        medians[(size, name)] = med
        read = sum(s["rows_read"].values())
        c = s["classes"]
        print(f"{size:>11} {name:>6} {med:>8.1f} {min(walls):>6.1f} {s['window_rows']:>7} "
              f"{read:>10} {read / med:>8.0f} {c['receipt_lost']['applied']:>8} "
              f"{c['rejected']['applied']:>8} {c['retry']['applied']:>6} {s['conflicts']:>9}")
    small = sizes[0]
    spark_small = medians[(small, "spark")]
    print(f"\ntarget: spark, {small} rows, <= 60 s: {spark_small:.1f}s "
          f"{'OK' if spark_small <= 60 else 'MISSED'}")
    print(f"spark vs plain SQL on {small} rows: {spark_small:.1f}s vs "
          f"{medians[(small, 'sql')]:.1f}s")
    if len(sizes) > 1:
        big = sizes[1]
        for name in ("spark", "sql"):
            ratio = medians[(big, name)] / medians[(small, name)]
            target = f" (target <= 1.2x: {'OK' if ratio <= 1.2 else 'MISSED'})" \
                if name == "spark" else ""
            print(f"{name}: {big} rows / {small} rows = {medians[(big, name)]:.1f}s / "
                  f"{medians[(small, name)]:.1f}s = {ratio:.2f}x{target}")


if __name__ == "__main__":
    main()
