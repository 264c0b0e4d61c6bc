"""What one INSERT costs on each way a Python process can send it to PostgreSQL: psycopg's cursor
(publish's path), libpq through psycopg's `pgconn` (a prepared statement, or an unnamed one per
call) and, when importable, asyncpg (txoutbox's driver). Why txoutbox's publish can be ahead of
consumer-kit's on PostgreSQL, and what a path below psycopg's cursor would buy.

    python bench/pg_insert_paths.py [--url postgresql+psycopg://...] [--n 5000] [--runs 3]

One connection per driver, one transaction per run, `--n` INSERTs of a three-column row into a
temporary table, timed in a loop (variants interleaved run by run; medians). A loop keeps the
code in the CPU's caches, so it shows each path's own cost, not what it adds to a business
transaction: `bench/publish_floor.py` and `python -m bench.peers` measure that. asyncpg is not
one of consumer-kit's dependencies: run this with a Python that has both (e.g. the txoutbox
peer venv with psycopg added) to see its row; without it, the row says it was skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average, machine_facts, parse_counts, table

CREATE = "CREATE TEMP TABLE ckit_paths (id bigserial PRIMARY KEY, a text, b bigint, c timestamp)"
PYFORMAT = "INSERT INTO ckit_paths (a, b, c) VALUES (%(a)s, %(b)s, %(c)s)"
DOLLAR = "INSERT INTO ckit_paths (a, b, c) VALUES ($1, $2, $3)"
TEXT = "x" * 30


def psycopg_paths(url: str, n: int) -> dict[str, Callable[[], float]]:
    """The psycopg and libpq variants, each a function timing `n` INSERTs (us per INSERT)."""
    import psycopg
    from psycopg import generators

    conn = psycopg.connect(url)
    conn.execute(CREATE)
    conn.commit()
    pg = conn.pgconn
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)

    def timed(body: Callable[[int], None]) -> float:
        started = time.perf_counter()
        for i in range(n):
            body(i)
        spent = time.perf_counter() - started
        conn.rollback()
        return spent / n * 1e6

    def cursor(i: int) -> None:
        cur = conn.cursor()
        cur.execute(PYFORMAT, {"a": TEXT, "b": i, "c": now})
        cur.close()

    def wrote_one() -> None:
        result = conn.wait(generators.execute(pg))[-1]
        if result.command_tuples != 1:
            raise RuntimeError(f"the INSERT wrote no row: {result.get_error_message()}")

    name = [b""]

    def prepared(i: int) -> None:
        # values made into text on every call, as the cursor's adapters and asyncpg do
        pg.send_query_prepared(name[0], [TEXT.encode(), str(i).encode(),
                                         now.isoformat().encode()])
        wrote_one()

    def unnamed(i: int) -> None:
        pg.send_query_params(DOLLAR.encode(), [TEXT.encode(), str(i).encode(),
                                               now.isoformat().encode()])
        wrote_one()

    def run(body: Callable[[int], None], prepare: bool = False) -> Callable[[], float]:
        def one_run() -> float:
            conn.execute("SELECT 1")  # opens the run's transaction, as every variant's
            if prepare:  # a new name each run: psycopg may run DEALLOCATE ALL after a
                # rollback (it does when it has prepared statements of its own)
                name[0] = f"ckit_paths_{len(name)}".encode()
                name.append(name[0])
                result = pg.prepare(name[0], DOLLAR.encode())
                if result.error_message:
                    raise RuntimeError(f"PREPARE failed: {result.get_error_message()}")
            return timed(body)
        return one_run

    return {"psycopg cursor.execute (publish's path; auto-prepared after 5)": run(cursor),
            "libpq via pgconn, a prepared statement": run(prepared, prepare=True),
            "libpq via pgconn, unnamed (parsed per call)": run(unnamed)}


def asyncpg_path(url: str, n: int) -> Callable[[], float] | None:
    """asyncpg's `execute` (its statement cache prepares), or None when not importable."""
    try:
        import asyncpg  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    loop = asyncio.new_event_loop()
    conn = loop.run_until_complete(asyncpg.connect(url))
    loop.run_until_complete(conn.execute(CREATE))
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)

    async def timed() -> float:
        tx = conn.transaction()
        await tx.start()
        started = time.perf_counter()
        for i in range(n):
            await conn.execute(DOLLAR, TEXT, i, now)
        spent = time.perf_counter() - started
        await tx.rollback()
        return spent / n * 1e6

    return lambda: loop.run_until_complete(timed())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get(
        "CKIT_TEST_PG_URL", "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_test"))
    parser.add_argument("--n", type=int, default=5000, help="INSERTs per run and variant")
    args = parse_counts(parser, argv, "--n")
    scheme, sep, rest = args.url.partition("://")
    if not sep or not scheme.startswith("postgresql"):
        parser.error(f"--url must be a postgresql URL, not {scheme!r}")
    url = "postgresql://" + rest  # (a driver named in the scheme is for SQLAlchemy)
    print(machine_facts())
    variants = psycopg_paths(url, args.n)
    slow = asyncpg_path(url, args.n)
    if slow is not None:
        variants["asyncpg execute (txoutbox's driver)"] = slow
    times: dict[str, list[float]] = {name: [] for name in variants}
    for run in range(args.runs):
        order = list(variants)[run % len(variants):] + list(variants)[:run % len(variants)]
        for name in order:
            times[name].append(variants[name]())
        print(f"  run {run + 1}/{args.runs}: " + ", ".join(
            f"{name.split(' (')[0]} {times[name][-1]:.1f} us" for name in variants))
    base = statistics.median(times[next(iter(variants))])
    print(table(["path", "us per INSERT (median)", "runs", "x psycopg cursor"],
                [[name, f"{statistics.median(t):.1f}", f"{min(t):.1f}-{max(t):.1f}",
                  f"{statistics.median(t) / base:.2f}x"] for name, t in times.items()]))
    if slow is None:
        print("asyncpg: not importable here, skipped (run with a Python that has psycopg and "
              "asyncpg to see it)")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
