"""Where `publish`'s time over the peer bench's floor goes: making the message id, the id's form
on the server, and publish's own Python, each measured against the floor in the same run.

    python bench/publish_floor.py                        # MariaDB from CKIT_TEST_MYSQL_URL
    python bench/publish_floor.py --url postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_test
    python bench/publish_floor.py --binary-ids          # message_id in a binary collation

Variants, interleaved transaction by transaction in rotating order (`bench.peers.harness`):

- bare          BEGIN, INSERT one order row, COMMIT;
- floor         bare + the outbox row by one hand-written INSERT, the peer bench's floor (its id
                a random uuid in hex, as every peer's floor);
- floor+ulid()  the floor, plus a call of `new_message_id()` whose id is thrown away: what
                making a ULID costs in Python where publish makes it (right after a round trip,
                when little of the code is in the CPU's caches: several times a loop's figure);
- floor-ulid    the floor's INSERT with the id `publish` writes (a ULID: 10 time characters and
                16 random ones, upper-case Crockford base32);
- publish       bare + `Outbox.publish` (the same SQL: `outbox_producer.insert`);
- driver bare, driver floor
                bare and floor with no SQLAlchemy at all: the same two INSERTs on one DBAPI
                connection held from the pool (PyMySQL, psycopg), committed by the driver;
- libpq floor   (psycopg only) the floor with its INSERT sent as a prepared statement through
                psycopg's `pgconn`, below psycopg's cursor, in the same SQLAlchemy transaction
                (a statement of the bench's own, prepared once per connection);
- publish, cursor
                (psycopg only) publish with its INSERT on psycopg's cursor, as before
                `consumer_kit/core/pg_prepared.py`: `publish` runs it below the cursor under
                the statement psycopg's cursor prepared for it (never one of its own), so
                this line is what that path saves.

`floor-ulid - floor+ulid()` is what the id's form costs the database, `floor+ulid() - floor` what
making it costs; `publish - floor-ulid` what publish's own work adds (checks, JSON, the row; on
PostgreSQL also its `ON CONFLICT DO NOTHING`). `driver floor - driver bare` is what the INSERT
costs the driver alone: the least any SQLAlchemy-free code on this driver could add. publish runs
in the caller's SQLAlchemy transaction, so its target is the floor; the driver line compares
added times across the two stacks, as the peer bench compares peers (each against its own bare).
Medians of `--runs` runs of `--tx` each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average, machine_facts, table
from bench.peers import harness
from bench.peers.runners.ckit import (
    FLOOR_COLUMNS,
    connection_variants,
    floor_row,
    floor_sql,
    orders_table,
    payload,
)
from consumer_kit.core import driver_sql, pg_prepared
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.schema.types import MESSAGE_ID_LEN
from outbox_producer import Outbox
from outbox_producer.ids import new_message_id


def variants(engine: sa.engine.Engine, orders: sa.Table, outbox: Outbox, outbox_t: sa.Table,
             sql: str) -> list[tuple[str, harness.Variant]]:
    """The peer bench's bare, floor and publish (`connection_variants`), and floor-ulid."""
    insert_order = orders.insert()
    peer = dict(connection_variants(engine, orders, outbox, outbox_t, sql))

    def floor_ulid(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            conn.exec_driver_sql(sql, {**floor_row("u" + key), "message_id": new_message_id()})

    def floor_making_ulid(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            row = floor_row("m" + key)
            new_message_id()  # made, not written
            conn.exec_driver_sql(sql, row)

    return [("bare", peer["bare"]), ("floor", peer["floor"]), ("floor+ulid()", floor_making_ulid),
            ("floor-ulid", floor_ulid), ("publish", peer["publish"])]


def driver_variants(dbapi: Any, orders_sql: str, sql: str) -> list[tuple[str, harness.Variant]]:
    """bare and floor on a DBAPI connection, no SQLAlchemy (`orders_sql`: the order INSERT as
    driver SQL)."""

    def bare(key: str) -> None:
        cursor = dbapi.cursor()
        cursor.execute(orders_sql, {"sku": key, "qty": 1})
        cursor.close()
        dbapi.commit()

    def floor(key: str) -> None:
        cursor = dbapi.cursor()
        cursor.execute(orders_sql, {"sku": key, "qty": 1})
        cursor.execute(sql, floor_row("d" + key))
        cursor.close()
        dbapi.commit()

    return [("driver bare", bare), ("driver floor", floor)]


def libpq_floor(engine: sa.engine.Engine, orders: sa.Table, sql: str, columns: Sequence[str]
                ) -> list[tuple[str, harness.Variant]]:
    """The floor with the outbox row sent through psycopg's `pgconn` as a prepared statement
    (prepared once per connection), or nothing when the driver is not psycopg."""
    if engine.dialect.driver != "psycopg":
        return []
    from psycopg import generators

    insert_order = orders.insert()
    names = {c: i for i, c in enumerate(columns, 1)}
    dollar = re.sub(r"%\((\w+)\)s", lambda m: f"${names[m.group(1)]}", sql).encode()

    def value(v: Any) -> bytes | None:
        if v is None or isinstance(v, bytes):
            return v
        return (v.isoformat() if isinstance(v, dt.datetime) else str(v)).encode()

    def floor(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(insert_order, {"sku": key, "qty": 1})
            raw = conn.connection.dbapi_connection
            pg = raw.pgconn  # type: ignore[union-attr]
            info = conn.connection.info  # kept with the DBAPI connection, across checkouts
            if "ckit_floor_prepared" not in info:
                result = pg.prepare(b"ckit_floor", dollar)
                if result.error_message:
                    raise RuntimeError(f"PREPARE: {result.get_error_message()}")
                info["ckit_floor_prepared"] = True
            row = floor_row("l" + key)
            values = [row[c] for c in columns]
            pg.send_query_prepared(b"ckit_floor", [value(v) for v in values],
                                   [1 if isinstance(v, bytes) else 0 for v in values])
            result = raw.wait(generators.execute(pg))[-1]  # type: ignore[union-attr]
            if result.command_tuples != 1:
                raise RuntimeError(f"the INSERT wrote no row: {result.get_error_message()}")

    return [("libpq floor", floor)]


class _CursorOnly:
    """`consumer_kit.core.pg_prepared` as `driver_sql` sees it, answering "use the cursor"."""

    NOT_RUN = pg_prepared.NOT_RUN

    @staticmethod
    def run(*args: Any) -> Any:
        return pg_prepared.NOT_RUN


def publish_on_the_cursor(engine: sa.engine.Engine, orders: sa.Table, outbox: Outbox
                          ) -> list[tuple[str, harness.Variant]]:
    """publish with its INSERT on psycopg's cursor (`pg_prepared` switched off for the call:
    two attribute stores), or nothing when the driver is not psycopg."""
    if engine.dialect.driver != "psycopg":
        return []
    insert_order = orders.insert()
    off = _CursorOnly()

    def publish(key: str) -> None:
        driver_sql.pg_prepared = off  # type: ignore[assignment]
        try:
            with engine.begin() as conn:
                conn.execute(insert_order, {"sku": key, "qty": 1})
                outbox.publish(conn, "ORDER_CREATED", payload(key), biz_type="order",
                               biz_key="q" + key)
        finally:
            driver_sql.pg_prepared = pg_prepared

    return [("publish, cursor", publish)]


def binary_ids(engine: sa.engine.Engine, table_name: str) -> None:
    """Give the outbox's `message_id` a binary collation (comparisons become byte compares)."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f'ALTER TABLE {table_name} ALTER COLUMN message_id TYPE '
                                 f'varchar({MESSAGE_ID_LEN}) COLLATE "C"')
        else:
            conn.exec_driver_sql(f"ALTER TABLE {table_name} MODIFY message_id "
                                 f"varchar({MESSAGE_ID_LEN}) CHARACTER SET ascii "
                                 "COLLATE ascii_bin NOT NULL")
    print("message_id: binary collation (--binary-ids)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python bench/publish_floor.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get(
        "CKIT_TEST_MYSQL_URL", "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test"))
    p.add_argument("--tx", type=int, default=2000, help="transactions of each variant per run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--binary-ids", action="store_true",
                   help="message_id in a binary collation (ascii_bin / \"C\"): is the id's "
                        "cost the string comparisons?")
    args = p.parse_args(argv)
    if args.tx < 1 or args.runs < 1:
        p.error("--tx and --runs must be at least 1")
    engine = make_engine(args.url)
    print(machine_facts(engine))
    print(f"load average at start: {load_average()}")
    prefix = f"bench_{uuid.uuid4().hex[:6]}_pf"
    metadata = sa.MetaData()
    orders = orders_table(metadata, prefix)
    outbox_t = outbox_table(metadata, f"{prefix}_outbox")
    metadata.create_all(engine)
    if args.binary_ids:
        binary_ids(engine, outbox_t.name)
    try:
        outbox = Outbox(engine, producer="bench", table=outbox_t.name)
        sql = floor_sql(engine, outbox_t.name)
        orders_sql = str(orders.insert().inline().compile(  # inline: no RETURNING id
            dialect=engine.dialect, column_keys=["sku", "qty"]))
        held = engine.raw_connection()  # a pool connection, given back below
        try:
            runs = harness.publish_runs(
                variants(engine, orders, outbox, outbox_t, sql)
                + libpq_floor(engine, orders, sql, FLOOR_COLUMNS)
                + publish_on_the_cursor(engine, orders, outbox)
                + driver_variants(held.dbapi_connection, orders_sql, sql), args.tx, args.runs)
        finally:
            held.close()
    finally:
        metadata.drop_all(engine)
        engine.dispose()
    median = {name: statistics.median(r[name] for r in runs) for name in runs[0]}
    driver = {name: median.pop(name) for name in ("driver bare", "driver floor")}
    floor_added = median["floor"] - median["bare"]
    rows = [[name, f"{ms:.3f}", "-" if name == "bare" else f"+{ms - median['bare']:.3f}",
             "-" if name == "bare" else f"{(ms - median['bare']) / floor_added:.2f}x"]
            for name, ms in median.items()]
    print(table(["variant", "ms per tx (median)", "added ms", "added / floor's"], rows))
    print(f"making the id: floor+ulid() - floor = "
          f"{median['floor+ulid()'] - median['floor']:+.3f} ms; its form on the server: "
          f"floor-ulid - floor+ulid() = {median['floor-ulid'] - median['floor+ulid()']:+.3f} ms;"
          f" publish's own work (checks, JSON, the row; on PostgreSQL also ON CONFLICT DO NOTHING):"
          f" publish - floor-ulid = "
          f"{median['publish'] - median['floor-ulid']:+.3f} ms")
    driver_added = driver["driver floor"] - driver["driver bare"]
    ratio = (f"{(median['publish'] - median['bare']) / driver_added:.2f}x that"
             if driver_added > 0 else "n/a (the driver's INSERT added nothing measurable)")
    print(f"the driver alone ({engine.dialect.driver}, no SQLAlchemy): bare "
          f"{driver['driver bare']:.3f} ms, floor {driver['driver floor']:.3f} ms, the INSERT "
          f"adds {driver_added:+.3f} ms; publish (over its SQLAlchemy bare) adds {ratio}")
    if "libpq floor" in median:
        libpq_added = median["libpq floor"] - median["bare"]
        print(f"the floor's INSERT below psycopg's cursor (libpq, a prepared statement): adds "
              f"{libpq_added:+.3f} ms, {libpq_added / floor_added:.2f}x the floor's; publish "
              f"adds {(median['publish'] - median['bare']) / libpq_added:.2f}x that"
              if libpq_added > 0 else "the libpq floor added nothing measurable")
    if "publish, cursor" in median:
        on_cursor = median["publish, cursor"] - median["bare"]
        print(f"publish below psycopg's cursor (under psycopg's own prepared statement) adds "
              f"{median['publish'] - median['bare']:+.3f} ms; on the cursor {on_cursor:+.3f} "
              f"ms: it saves {on_cursor - (median['publish'] - median['bare']):.3f} ms")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
