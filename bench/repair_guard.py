"""What the compare-and-set's message-id guard costs MariaDB to plan: each row as a third column
of the row constructor, `(id, lock_version, message_id) IN (...)` (before), against the
`(id, lock_version)` pairs with `message_id = CASE id WHEN ... END` (`core.transitions`, now).

    python bench/repair_guard.py [--url mysql+pymysql://...] [--rows 1000] [--spread 50] [--runs 3]

Builds a temporary outbox of `rows * spread` rows (one SENT row in every `spread`, as a
reconcile window's ids are spread), then times EXPLAIN of each form's UPDATE over the SENT
rows (planning only: EXPLAIN runs nothing), interleaved run by run; medians. The reconciler
repairs (and the relay claims candidates) in such batches: before, planning dominated them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.common import machine_facts, table
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.transitions import Versions, _statements

NOW = dt.datetime(2026, 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("CKIT_TEST_MYSQL_URL",
                                                        "mysql+pymysql://ckit:ckit@127.0.0.1/ckit_test"))
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--spread", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    engine = make_engine(args.url)
    print(machine_facts(engine))
    t = outbox_table(sa.MetaData(), f"bench_guard_{os.getpid()}")
    t.create(engine)
    try:
        with engine.begin() as conn:
            rows = [{"message_id": f"m{i:07d}", "biz_type": "t", "biz_key": str(i), "topic": "T",
                     "body": b"{}", "state": 2 if i % args.spread == 0 else 4,
                     "next_retry_at": NOW, "gmt_create": NOW, "gmt_modified": NOW}
                    for i in range(args.rows * args.spread)]
            for start in range(0, len(rows), 5000):
                conn.execute(sa.insert(t), rows[start:start + 5000])
            sent = conn.execute(sa.select(t.c.id, t.c.lock_version, t.c.message_id)
                                .where(t.c.state == 2)).all()
            conn.exec_driver_sql(f"ANALYZE TABLE {t.name}").all()
        pairs = [(r.id, r.lock_version) for r in sent]
        mids = [r.message_id for r in sent]
        [now_stmt] = _statements(t, "repair_exhausted", Versions(pairs, mids), now=NOW, by=None,
                                 values=None)
        before_stmt = (sa.update(t).where(
            sa.tuple_(t.c.id, t.c.lock_version, t.c.message_id).in_(
                [(i, v, m) for (i, v), m in zip(pairs, mids, strict=True)]),
            t.c.state == 2).values(state=5))
        forms = {"before: (id, lock_version, message_id) IN": before_stmt,
                 "now: (id, lock_version) IN + CASE id": now_stmt}
        spent: dict[str, list[float]] = {name: [] for name in forms}
        with engine.connect() as conn:
            for _ in range(args.runs):
                for name, stmt in forms.items():
                    sql = "EXPLAIN " + str(stmt.compile(
                        engine, compile_kwargs={"literal_binds": True})).replace("%", "%%")
                    started = time.perf_counter()
                    conn.exec_driver_sql(sql).all()
                    spent[name].append(time.perf_counter() - started)
        base = statistics.median(spent["before: (id, lock_version, message_id) IN"])
        print(f"\n{len(pairs):,} guarded rows in a {len(rows):,}-row outbox; EXPLAIN "
              f"(planning only), median of {args.runs}:")
        print(table(["guard", "ms", "x before"],
                    [[name, f"{statistics.median(v) * 1e3:.1f}",
                      f"{statistics.median(v) / base:.3f}x"] for name, v in spent.items()]))
    finally:
        t.drop(engine)
        engine.dispose()


if __name__ == "__main__":
    main()
