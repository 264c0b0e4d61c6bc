"""A day-partitioned outbox on MySQL/MariaDB: retention by DROP PARTITION, not by DELETE.

`ckit outbox partitions create` makes the outbox a table partitioned `BY RANGE COLUMNS
(message_id)`: message ids are ULIDs, whose first ten characters are their creation time, so a
day's messages are one range of ids, partition `pYYYYMMDD`, plus a catch-all `pmax`. InnoDB
wants the partitioning column in every unique key; keying on `message_id` keeps it exact:

- `message_id` stays UNIQUE on its own (it is the partitioning column), and the primary key is
  `(id, message_id)` (`id` is still AUTO_INCREMENT, so still unique);
- `(biz_type, biz_key)` cannot stay unique in a partitioned table, so it moves to a small
  unpartitioned key table `<outbox>_key` (primary key `(biz_type, biz_key)`), filled by a
  BEFORE INSERT trigger: a second publish of a key fails on it with the same duplicate-key
  error as before, and `Outbox.publish` returns the first message id unchanged (the outbox
  keeps a plain index on `(biz_type, biz_key)` for that lookup).

`rotate` adds the coming days' partitions (splitting the empty `pmax`: no rows move) and
retires old days: a partition goes only when every row in it is CONSUMED (REJECTED too with
`include_rejected`), after its rows are copied to the archive in small key-ordered batches;
then `DROP PARTITION`, a metadata change instead of millions of row deletes, and only after it
the day's receipt and key rows are deleted in the same small batches. A day kept by the last
check is left as it was: deleting its key rows first would let a key still in the outbox be
published a second time. A run that dies between the drop and those deletes leaves key rows
whose publish fails with a duplicate key (never a second send) until the next run deletes
them: a dropped day's range joins the next partition's, and each run deletes the receipt and
key rows of such ranges whose message is not in the outbox. One run per table at a time (the
archive's lock).

The last check and the drop run under `LOCK TABLES <outbox> WRITE`. Plain reads neither see nor
wait for a publish still in its transaction, and DROP PARTITION waits for that transaction and
then drops the row it committed (a publish open across midnight, or one that starts between a
check and the drop). The lock is granted once every transaction that touched the outbox has
ended and admits none until the drop is done, so the check and the row count under it see
every row the partition will hold. `EXCHANGE PARTITION` into an empty copy would not close the
gap by itself: the emptied partition takes new rows until it is dropped, a second check and
exchange back need the same exclusive lock, and meanwhile the day's rows are missing from the
outbox (`publish` of one of their keys finds the key row but not the message). The cost is the
moment DROP PARTITION already imposed: publishes, the relay and the operator commands wait for
the checks (index reads: no row left open, none newer than the count taken before the lock)
and the drop, once per retired day; the publish path is unchanged otherwise. The lock is waited
for at most `LOCK_WAIT_SECONDS` (a long transaction on the outbox would hold every publish
queued behind the pending lock): then the day is kept for the next run. The database user
needs the LOCK TABLES privilege.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import dialect_name, read_committed
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.states import OutboxState
from consumer_kit.core.urls import mask_url
from outbox_producer.ids import ulid_floor
from outbox_producer.ops.archiving import ARCHIVE_FLOOR, single_instance
from outbox_producer.ops.partition_tables import (
    MAX,
    check_days_ahead,
    drop_made,
    key_trigger,
    partitioned_outbox_table,
)
from outbox_producer.ops.table_lock import LockBusy, write_locked
from outbox_producer.ops.tables import OutboxTables, key_table

DEFAULT_DAYS_AHEAD = 3
DEFAULT_BATCH = 1000
#: A dropped day's keys can be published again: the archive's safety floor (`ckit outbox
#: partitions rotate` refuses a shorter horizon without --force, as `ckit outbox archive` does).
DEFAULT_OLDER_THAN = ARCHIVE_FLOOR
#: How long `rotate` waits for the outbox's write lock before keeping the day for the next run
LOCK_WAIT_SECONDS = 10


def day_name(day: dt.date) -> str:
    """`pYYYYMMDD`: the partition of the messages made on `day` (UTC)."""
    return f"p{day:%Y%m%d}"


def _day_bound(day: dt.date) -> str:
    """The upper bound of `day`'s partition: the first ULID of the next day."""
    return ulid_floor(dt.datetime.combine(day + dt.timedelta(days=1), dt.time()))


@dataclasses.dataclass(frozen=True)
class Partition:
    """One partition: its name, exclusive upper bound (a ULID, or MAXVALUE) and estimated rows."""

    name: str
    upper: str
    rows: int


@dataclasses.dataclass
class RotateResult:
    """What `rotate` did: partitions added, dropped (with the rows archived first), kept."""

    added: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    archived: int = 0
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    #: receipt and key rows deleted with their dropped days (or left by earlier drops)
    cleaned: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)

    def done(self) -> str | None:
        """What is committed so far, in words, or None for nothing (`committed_on_error`)."""
        parts = [counted(len(self.added), "partition", "added"),
                 counted(self.archived, "row", "copied to the archive"),
                 counted(len(self.dropped), "partition", "dropped"),
                 counted(self.cleaned, "receipt or key row", "deleted")]
        return ", ".join(p for p in parts if p) or None


def _require_mysql(engine: Engine) -> None:
    if dialect_name(engine) != "mysql":
        raise ConfigError("a partitioned outbox needs MySQL or MariaDB")


def create(engine: Engine, tables: OutboxTables, *, days_ahead: int = DEFAULT_DAYS_AHEAD,
           today: dt.date | None = None) -> list[str]:
    """Create the partitioned outbox (today's and `days_ahead` more days, then `pmax`), its key
    table and trigger, and the receipt and archive tables. Returns the partition names.

    Raises:
        ConfigError: not MySQL/MariaDB, or the outbox table exists already (partitioning a
            live table is an online schema change: docs/scale-out.md).
    """
    _require_mysql(engine)
    check_days_ahead(days_ahead)
    name = tables.outbox.name
    if sa.inspect(engine).has_table(name):
        raise ConfigError(f"table {name} exists; a partitioned outbox is created new "
                          "(see docs/scale-out.md for moving a live one)")
    metadata = sa.MetaData()
    outbox = partitioned_outbox_table(metadata, name)
    keys = key_table(metadata, name)
    day = today or utcnow().date()
    days = [day + dt.timedelta(days=i) for i in range(days_ahead + 1)]
    parts = ", ".join(f"PARTITION {day_name(d)} VALUES LESS THAN ('{_day_bound(d)}')"
                      for d in days)
    keys_there = sa.inspect(engine).has_table(keys.name)  # (then never dropped on failure)
    try:
        with engine.begin() as conn:
            outbox.create(conn)
            conn.exec_driver_sql(f"ALTER TABLE {name} PARTITION BY RANGE COLUMNS(message_id) "
                                 f"({parts}, PARTITION pmax VALUES LESS THAN ({MAX}))")
            keys.create(conn, checkfirst=True)
            conn.exec_driver_sql(key_trigger(name))
    except Exception:
        # each statement committed by itself: none may stay (unless the database is away
        # too: the first error is the one to say)
        with contextlib.suppress(Exception):
            drop_made(engine, name, keys=not keys_there)
        raise
    tables.receipts.create(engine, checkfirst=True)
    tables.archive.create(engine, checkfirst=True)
    return [*(day_name(d) for d in days), "pmax"]


def partitions(engine: Engine, table: str) -> list[Partition]:
    """The table's partitions in order (empty when it is not partitioned).

    Raises:
        ConfigError: not MySQL/MariaDB, or no such table (read as one without partitions).
    """
    _require_mysql(engine)
    if not sa.inspect(engine).has_table(table):
        raise ConfigError(f"table {table} missing in {mask_url(engine.url)}: a misspelt "
                          "--outbox-table, or `ckit outbox partitions create` not run yet")
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS "
            "FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = :t AND PARTITION_NAME IS NOT NULL "
            "ORDER BY PARTITION_ORDINAL_POSITION"), {"t": table}).all()
    return [Partition(str(n), str(d).strip("'"), int(r or 0)) for n, d, r in rows]


def rotate(engine: Engine, tables: OutboxTables, *, days_ahead: int = DEFAULT_DAYS_AHEAD,
           older_than: dt.timedelta = DEFAULT_OLDER_THAN, batch: int = DEFAULT_BATCH,
           pause: float = 0.0, include_rejected: bool = False,
           now: dt.datetime | None = None, max_drops: int | None = None) -> RotateResult:
    """Add the partitions of the next `days_ahead` days; archive and drop each day partition
    whose day ended `older_than` ago and whose rows are all CONSUMED (or REJECTED with
    `include_rejected`), at most `max_drops` of them. A partition still holding other rows is
    kept (`kept` says why).

    Raises:
        ConfigError: not MySQL/MariaDB, the table is not partitioned, or bad numbers.
        ArchiveBusy: another archive or rotation of this table runs.
    """
    _require_mysql(engine)
    engine = read_committed(engine)  # no gap locks from the copies' and deletes' range reads
    if batch < 1 or days_ahead < 0 or pause < 0:
        raise ConfigError("--batch must be >= 1, --days-ahead and --pause >= 0")
    check_days_ahead(days_ahead)
    now = now or utcnow()
    name = tables.outbox.name
    result = RotateResult()
    # the count outside the lock: an error releasing it must still say what was done
    with committed_on_error(result.done), single_instance(engine, name):
        found = partitions(engine, name)
        if not found or found[-1].upper != MAX:
            raise ConfigError(f"table {name} is not a partitioned outbox (ckit outbox "
                              "partitions create)")
        result.added = _add_days(engine, name, found, now.date(), days_ahead)
        _sweep_absorbed(engine, tables, found, batch, pause, result)
        horizon = ulid_floor(now - older_than)
        done = {int(OutboxState.CONSUMED)}
        if include_rejected:
            done.add(int(OutboxState.REJECTED))
        lower = ""
        for part in partitions(engine, name)[:-1]:
            if part.upper > horizon or (max_drops is not None
                                        and len(result.dropped) >= max_drops):
                break
            why = _retire(engine, tables, part, lower, done, batch, pause, result)
            if why:
                result.kept[part.name] = why
            lower = part.upper
    return result


def _add_days(engine: Engine, name: str, found: list[Partition], today: dt.date,
              days_ahead: int) -> list[str]:
    last = found[-2].upper if len(found) > 1 else ""
    wanted = [today + dt.timedelta(days=i) for i in range(days_ahead + 1)]
    new = [d for d in wanted if _day_bound(d) > last]
    if not new:
        return []
    parts = ", ".join(f"PARTITION {day_name(d)} VALUES LESS THAN ('{_day_bound(d)}')"
                      for d in new)
    # added ahead of time, the new days split an empty pmax: no row moves (if the rotation
    # fell behind, the rows pmax took meanwhile are copied into their day: run it daily)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {name} REORGANIZE PARTITION pmax INTO "
                             f"({parts}, PARTITION pmax VALUES LESS THAN ({MAX}))")
    return [day_name(d) for d in new]


def _retire(engine: Engine, tables: OutboxTables, part: Partition, lower: str, done: set[int],
            batch: int, pause: float, result: RotateResult) -> str | None:
    """Archive and drop one partition, then delete its receipt and key rows; return why it was
    kept instead (untouched but for the archive copies), or None."""
    name = tables.outbox.name
    with engine.connect() as conn:
        if _open_rows(conn, name, part.name, done):
            return "rows not yet CONSUMED"
    _copy_to_archive(engine, tables, part.name, batch, pause, result)
    with engine.connect() as conn:  # only this run writes the archive (the archive's lock)
        archived = int(conn.scalar(
            sa.select(sa.func.count()).select_from(tables.archive)
            .where(tables.archive.c.message_id >= lower,
                   tables.archive.c.message_id < part.upper)) or 0)
        # counted before the lock: a day of rows is not read while every writer waits
        held, last_id = conn.execute(sa.text(
            f"SELECT COUNT(*), MAX(id) FROM {name} PARTITION ({part.name})")).one()
    if archived < int(held or 0):  # published into since the copy (a late publish): the
        # next run copies it (the locked checks below decide whether the day can go)
        return (f"{int(held) - archived} row(s) not in the archive yet (published into the day "
                "since it was copied): the next run copies them")
    try:
        with write_locked(engine, name, wait=LOCK_WAIT_SECONDS) as conn:
            # every transaction that wrote the outbox has ended, and none starts before the
            # drop (they queue behind the lock): a row committed since the count is PENDING
            # (publish writes no other state, and the relay waits too) or has a higher id
            if _open_rows(conn, name, part.name, done):
                return "a row arrived or left CONSUMED while it was archived"
            if conn.execute(sa.text(f"SELECT 1 FROM {name} PARTITION ({part.name}) "
                                    "WHERE id > :last LIMIT 1"),
                            {"last": int(last_id or 0)}).first() is not None:
                return "a row arrived while it was archived"
            conn.exec_driver_sql(f"ALTER TABLE {name} DROP PARTITION {part.name}")
    except LockBusy:
        return (f"the outbox stayed busy for {LOCK_WAIT_SECONDS} s (a long transaction on it): "
                "the next run tries again")
    result.dropped.append(part.name)
    # only now: a key row deleted while its row is still in the outbox lets the key be
    # published again. Dying here leaves key rows whose publish fails (a duplicate key, never
    # a second send) until the next run's `_sweep_absorbed` deletes them.
    _delete_orphans(engine, tables, lower, part.upper, batch, pause, result)
    return None


def _day_start(part: Partition) -> str | None:
    """The first ULID of the day a `pYYYYMMDD` partition was made for (None for another name)."""
    try:
        day = dt.datetime.strptime(part.name, "p%Y%m%d")
    except ValueError:
        return None
    return ulid_floor(day)


def _sweep_absorbed(engine: Engine, tables: OutboxTables, found: list[Partition], batch: int,
                    pause: float, result: RotateResult) -> None:
    """Delete the receipt and key rows left in the ranges of dropped days: a dropped day's
    range joins the next partition's, below the first id of that partition's own day."""
    lower = ""
    for part in found[:-1]:
        start = _day_start(part)
        if start is not None and lower < start:
            _delete_orphans(engine, tables, lower, start, batch, pause, result)
        lower = part.upper


def _delete_orphans(engine: Engine, tables: OutboxTables, lower: str, upper: str, batch: int,
                    pause: float, result: RotateResult) -> None:
    """Delete the receipt and key rows in [lower, upper) whose message is not in the outbox."""
    for table in (tables.receipts, key_table(sa.MetaData(), tables.outbox.name)):
        _delete_range(engine, table, tables.outbox, lower, upper, batch, pause, result)


def _open_rows(conn: Connection, table: str, part: str, done: set[int]) -> bool:
    states = ", ".join(str(s) for s in sorted(done))
    return conn.execute(sa.text(f"SELECT 1 FROM {table} PARTITION ({part}) "
                                f"WHERE state NOT IN ({states}) LIMIT 1")).first() is not None


def _copy_to_archive(engine: Engine, tables: OutboxTables, part: str, batch: int,
                     pause: float, result: RotateResult) -> int:
    """Copy the partition's rows into the archive in id order, `batch` rows per transaction,
    skipping rows an interrupted earlier run copied already; each committed batch is counted
    into `result.archived`. Returns the rows this call copied."""
    outbox, archive = tables.outbox, tables.archive
    quote = engine.dialect.identifier_preparer.quote  # `keys` is a reserved word
    columns = ", ".join(quote(c.name) for c in outbox.columns)
    copied, last = 0, 0
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(sa.text(
                f"SELECT id FROM {outbox.name} PARTITION ({part}) WHERE id > :last "
                "ORDER BY id LIMIT :n"), {"last": last, "n": batch}).scalars())
            if not ids:
                return copied
            moved = _insert_missing(conn, outbox.name, archive.name, columns, part, ids)
        copied += moved
        result.archived += moved
        last = ids[-1]
        if len(ids) < batch:
            return copied
        if pause:
            time.sleep(pause)


def _insert_missing(conn: Connection, outbox: str, archive: str, columns: str, part: str,
                    ids: list[int]) -> int:
    marks = ", ".join(str(int(i)) for i in ids)
    return int(conn.exec_driver_sql(
        f"INSERT INTO {archive} ({columns}) SELECT {columns} FROM {outbox} PARTITION ({part}) o "
        f"WHERE o.id IN ({marks}) AND NOT EXISTS "
        f"(SELECT 1 FROM {archive} a WHERE a.message_id = o.message_id)").rowcount)


def _delete_range(engine: Engine, table: sa.Table, outbox: sa.Table, lower: str, upper: str,
                  batch: int, pause: float, result: RotateResult) -> None:
    """Delete `table`'s rows whose message_id is in [lower, upper) and not in the outbox (a
    message published into the range meanwhile keeps its rows), in message_id order; each
    committed batch is counted into `result.cleaned`."""
    m = table.c.message_id
    # the message id's range lets the server read only the partition that holds it
    gone = ~sa.exists().where(outbox.c.message_id == m, outbox.c.message_id >= lower,
                              outbox.c.message_id < upper)
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(sa.select(m).where(m >= lower, m < upper, gone).distinct()
                                    .order_by(m).limit(batch)).scalars())
            if not ids:
                return
            # by the message_id index: a statement that scans locks rows of publishes in flight
            gone_rows = conn.execute(sa.delete(table).where(m.in_(ids))).rowcount
        result.cleaned += gone_rows
        if len(ids) < batch:
            return
        if pause:
            time.sleep(pause)
