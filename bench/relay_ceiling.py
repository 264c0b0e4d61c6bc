"""Where a PostgreSQL drain's time goes: the relay against its own SQL alone.

Three drains of the same fresh backlog, interleaved run by run on one PostgreSQL:

- *relay*: `Relay.run_once()` (one process, `--workers` loops) to a transport whose send does
  nothing, on the outbox table as `ckit db init` creates it (7 indexes);
- *relay, --claim lock*: the same relay holding each batch locked while it sends, marking it in
  that transaction (one UPDATE per row: `outbox_producer.locked`);
- *SQL only*: the same claim (`WITH picked ... FOR UPDATE SKIP LOCKED ... UPDATE ... RETURNING`)
  and mark (`UPDATE ... FROM jsonb_array_elements(...)`) statements the relay sends, from one
  psycopg connection with nothing else per row: the ceiling of this schema on this server;
- *SQL only, 2 indexes*: the same statements on a copy of the table with only the primary key
  and the `(state, next_retry_at)` index: what the other five indexes cost. Both statements
  change `state`, an indexed column, so neither update is HOT: every index gets a new entry
  for every row, twice per send.
- *SQL only, locked send*: `--claim lock`'s statements from one connection (`SELECT ... FOR
  UPDATE SKIP LOCKED`, then the mark from PENDING, one commit): the ceiling of one write per row.

    python bench/relay_ceiling.py [--url URL] [--rows 30000] [--batch 500] [--runs 3]

Prints rows/s per run, medians and ratios (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_facts, table
from bench.peers.runners.ckit import NullTransport
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import outbox_table
from outbox_producer import Relay

FILL = """INSERT INTO {t} (message_id, biz_type, biz_key, topic, body, state, retry_count,
  max_retries, next_retry_at, lock_version, created_by, gmt_create, gmt_modified)
  SELECT md5(g::text || %(salt)s), 'order', g::text, 'ORDER_CREATED',
  convert_to('{{"order_id":"' || g || '","sku":"SKU-1","qty":1}}', 'UTF8'), 0, 0, 10,
  now() AT TIME ZONE 'UTC', 0, 'bench', now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC'
  FROM generate_series(1, %(n)s) g"""
CLAIM = """WITH picked AS MATERIALIZED (SELECT id FROM {t}
  WHERE state = 0 AND next_retry_at <= %(now)s ORDER BY next_retry_at LIMIT %(n)s
  FOR UPDATE SKIP LOCKED)
  UPDATE {t} SET state = 1, lock_version = lock_version + 1, gmt_modified = %(now)s,
  updated_by = 'raw', lease_owner = 'raw', lease_until = %(now)s, last_attempt_at = %(now)s
  WHERE id = ANY(ARRAY(SELECT id FROM picked))
  RETURNING id, message_id, biz_type, biz_key, topic, tags, keys, headers, body, retry_count,
  max_retries, created_by, gmt_create, lock_version, state, sent_at"""
MARK = """UPDATE {t} AS o SET state = 2, broker_message_id = v.val,
  lock_version = o.lock_version + 1, gmt_modified = %(now)s, updated_by = 'raw',
  sent_at = %(now)s, lease_owner = NULL, lease_until = NULL, fail_reason = NULL
  FROM (SELECT CAST(r->>0 AS BIGINT) AS id, CAST(r->>1 AS INTEGER) AS lv, r->>2 AS val
        FROM jsonb_array_elements(CAST(%(rows)s AS JSONB)) AS e(r)) AS v
  WHERE o.id = v.id AND o.lock_version = v.lv AND o.state IN (1)"""
PICK = """SELECT id, message_id, biz_type, biz_key, topic, tags, keys, headers, body, retry_count,
  max_retries, created_by, gmt_create, lock_version, state, sent_at FROM {t}
  WHERE state = 0 AND next_retry_at <= %(now)s ORDER BY next_retry_at LIMIT %(n)s
  FOR UPDATE SKIP LOCKED"""


def dsn(url: str) -> str:
    """A libpq URL from a SQLAlchemy one."""
    return sa.engine.make_url(url).set(drivername="postgresql").render_as_string(
        hide_password=False)


def fill(conn: psycopg.Connection, name: str, rows: int) -> None:
    with conn.cursor() as cur:
        cur.execute(f"TRUNCATE {name}")
        cur.execute(FILL.format(t=name), {"n": rows, "salt": uuid.uuid4().hex})
    conn.commit()
    with conn.cursor() as cur:
        cur.execute(f"ANALYZE {name}")
    conn.commit()


def mark_params(rows: list[tuple[Any, ...]], now: object) -> dict[str, object]:
    """MARK's parameters for rows read by CLAIM or PICK (id first, lock_version 14th)."""
    return {"now": now, "rows": json.dumps([[r[0], r[13], f"b{r[0]}"] for r in rows])}


def raw_drain(conn: psycopg.Connection, name: str, batch: int) -> tuple[float, int]:
    claim, mark = CLAIM.format(t=name), MARK.format(t=name)
    t0 = time.perf_counter()
    moved = 0
    while True:
        now = utcnow()
        with conn.cursor() as cur:
            cur.execute(claim, {"n": batch, "now": now})
            rows = cur.fetchall()
        conn.commit()
        if not rows:
            return time.perf_counter() - t0, moved
        with conn.cursor() as cur:
            cur.execute(mark, mark_params(rows, now))
            moved += cur.rowcount
        conn.commit()


def locked_drain(conn: psycopg.Connection, name: str, batch: int) -> tuple[float, int]:
    """Pick with row locks, mark SENT, commit: one UPDATE per row, the send inside the lock."""
    pick, mark = PICK.format(t=name), MARK.format(t=name).replace("o.state IN (1)",
                                                                  "o.state IN (0)")
    t0 = time.perf_counter()
    moved = 0
    while True:
        now = utcnow()
        with conn.cursor() as cur:
            cur.execute(pick, {"n": batch, "now": now})
            rows = cur.fetchall()
            if not rows:
                conn.commit()
                return time.perf_counter() - t0, moved
            cur.execute(mark, mark_params(rows, now))
            moved += cur.rowcount
        conn.commit()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get(
        "CKIT_TEST_PG_URL", "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_test"))
    p.add_argument("--rows", type=int, default=30_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--workers", type=int, default=2, help="the relay's loops (threads)")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    engine = make_engine(a.url)
    if engine.dialect.name != "postgresql":
        print(f"error: --url must be PostgreSQL, not {engine.dialect.name}", file=sys.stderr)
        return 2
    print(machine_facts(engine))
    prefix = f"bench_{uuid.uuid4().hex[:6]}"
    metadata = sa.MetaData()
    full = outbox_table(metadata, f"{prefix}_full")
    lean = outbox_table(metadata, f"{prefix}_lean")
    metadata.create_all(engine, tables=[full])
    with engine.begin() as c:  # the same columns, only the primary key and the claim's index
        c.exec_driver_sql(f"CREATE TABLE {lean.name} (LIKE {full.name} INCLUDING DEFAULTS)")
        c.exec_driver_sql(f"ALTER TABLE {lean.name} ADD PRIMARY KEY (id)")
        c.exec_driver_sql(f"CREATE SEQUENCE {lean.name}_seq OWNED BY {lean.name}.id")
        c.exec_driver_sql(f"ALTER TABLE {lean.name} ALTER id SET DEFAULT "
                          f"nextval('{lean.name}_seq')")
        c.exec_driver_sql(f"CREATE INDEX ix_{lean.name}_sn ON {lean.name} (state, next_retry_at)")
    conn = psycopg.connect(dsn(a.url))
    rates: dict[str, list[float]] = {
        name: [] for name in ("relay", "relay, --claim lock", "SQL only", "SQL only, 2 indexes",
                              "SQL only, locked send")}
    try:
        for _ in range(a.runs):
            fill(conn, full.name, a.rows)
            relay = Relay(engine, NullTransport(), table=full.name, batch=a.batch,
                          workers=a.workers)
            t0 = time.perf_counter()
            sent = relay.run_once().stats.sent
            rates["relay"].append(sent / (time.perf_counter() - t0))
            fill(conn, full.name, a.rows)
            locked = Relay(engine, NullTransport(), table=full.name, batch=a.batch,
                           workers=a.workers, claim="lock")
            t0 = time.perf_counter()
            sent_locked = locked.run_once().stats.sent
            rates["relay, --claim lock"].append(sent_locked / (time.perf_counter() - t0))
            fill(conn, full.name, a.rows)
            seconds, moved = raw_drain(conn, full.name, a.batch)
            rates["SQL only"].append(moved / seconds)
            fill(conn, lean.name, a.rows)
            seconds, moved = raw_drain(conn, lean.name, a.batch)
            rates["SQL only, 2 indexes"].append(moved / seconds)
            fill(conn, full.name, a.rows)
            seconds, moved = locked_drain(conn, full.name, a.batch)
            rates["SQL only, locked send"].append(moved / seconds)
            if a.rows != sent or a.rows != moved or a.rows != sent_locked:
                print(f"error: moved {sent} / {sent_locked} / {moved} of {a.rows} rows",
                      file=sys.stderr)
                return 1
    finally:
        conn.close()
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE IF EXISTS {lean.name}")
        metadata.drop_all(engine, tables=[full])
        engine.dispose()
    relay_rate = statistics.median(rates["relay"])
    print(f"\n{a.rows:,} rows per drain, batch {a.batch}, relay workers {a.workers}, "
          f"{a.runs} runs interleaved")
    print(table(["drain", "rows/s (median)", "runs", "x relay"],
                [[name, f"{statistics.median(v):,.0f}", ", ".join(f"{x:,.0f}" for x in v),
                  f"{statistics.median(v) / relay_rate:.2f}x"] for name, v in rates.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
