"""Archiving terminal outbox rows: `ckit outbox archive --older-than 30d`.

Moves CONSUMED and REJECTED rows older than the horizon into the archive table in bounded
batches, each one transaction (insert-select by id list, then delete with the same guard, and
the receipt rows of the moved messages with them), one
instance per table at a time (GET_LOCK on MariaDB/MySQL, an advisory lock on PostgreSQL, the
write lock itself on SQLite).

No delete storms on a hot outbox: batches are small, picked in primary-key order at READ
COMMITTED (each locks only its own rows, never a gap or a range the relay or `publish` needs),
with `pause` seconds between them so the server's purge and replication keep up.
Receipt-driven archiving (`expect`): a CONSUMED row is archivable once every group expected for
its topic has its consumed receipt stored, checked against the receipt rows themselves in the
batch's own statements.

On a partitioned outbox (`ckit outbox partitions`) the moved rows' `<outbox>_key` rows are
deleted in the same batch: as on a plain outbox, where the row carries the unique key, a key
whose row was archived can be published again (the safety floor is why), instead of failing
for ever on a key row left behind. Archiving stays allowed there: it retires terminal rows
`rotate` keeps (a day held by one REJECTED row, or receipt-driven with `expect`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.clock import unit_note, utcnow
from consumer_kit.core.db import check_tables, dialect_name, read_committed
from consumer_kit.core.errors import ArchiveBusy, ConfigError, OutboxError
from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.receipt import ReceiptOutcome
from consumer_kit.core.receipts_applier import group_names
from consumer_kit.core.states import TERMINAL_STATES, OutboxState
from consumer_kit.core.transitions import OPTION
from outbox_producer.ops.tables import OutboxTables, key_table

#: What archiving moves: the terminal states (core/states.py).
ARCHIVE_STATES: tuple[OutboxState, ...] = TERMINAL_STATES
DEFAULT_ARCHIVE_BATCH = 1000
#: `ckit outbox archive` refuses a younger horizon without --force: `publish` is idempotent on
#: (biz_type, biz_key) only while the first row is in the outbox table, so a business event
#: published again after its row moved would go out again (as the processed purge's floor).
ARCHIVE_FLOOR = dt.timedelta(days=7)

DEFAULT_ARCHIVE_MAX_BATCHES = 1000


def check_archive_floor(horizon: dt.timedelta, *, option: str, force: bool, verb: str) -> None:
    """Refuse a horizon under `ARCHIVE_FLOOR` without `force` (`ckit outbox archive` and
    `partitions rotate`: rows leaving the outbox free their (biz_type, biz_key)).

    Raises:
        ConfigError: one line naming `option`, why, and --force.
    """
    if horizon < ARCHIVE_FLOOR and not force:
        raise ConfigError(
            f"--older-than {option}{unit_note(option)} is under the safety floor of "
            f"{ARCHIVE_FLOOR.days} days: "
            "publish is idempotent on (biz_type, biz_key) only while the row is in the outbox, "
            f"so the same business event published again would go out again (--force to {verb} "
            "anyway)")


@dataclasses.dataclass(frozen=True)
class ArchiveResult:
    """Outcome of `archive`: rows moved (or eligible, on a dry run) and batches run."""

    moved: int
    batches: int
    cutoff: dt.datetime
    more: bool
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


def archive(
    engine: Engine,
    tables: OutboxTables,
    older_than: dt.timedelta,
    *,
    batch: int = DEFAULT_ARCHIVE_BATCH,
    max_batches: int | None = DEFAULT_ARCHIVE_MAX_BATCHES,
    states: Sequence[OutboxState] = ARCHIVE_STATES,
    dry_run: bool = False,
    now: dt.datetime | None = None,
    pause: float = 0.0,
    expect: Mapping[str, Sequence[str]] | None = None,
) -> ArchiveResult:
    """Move terminal rows last changed before `now - older_than` into the archive table.

    `pause` seconds pass between batches. With `expect` (topic -> consumer groups) archiving is
    receipt-driven: only CONSUMED rows of those topics whose every expected group's consumed
    receipt is stored are moved (`older_than` is then a grace period).

    Each batch is one transaction: pick up to `batch` ids (keyset on `id`), lock them (`FOR
    UPDATE` on MySQL/PostgreSQL), `INSERT INTO archive SELECT ... WHERE id IN (...)`, then `DELETE`
    the same ids under the same guard; the two row counts must agree or the batch rolls back.
    The moved messages' receipt rows, and on a partitioned outbox their `<outbox>_key` rows,
    are deleted in the same transaction. The archive table is created when missing. One run
    per outbox table at a time: `GET_LOCK` on MySQL/MariaDB, `pg_try_advisory_lock` on
    PostgreSQL; on SQLite each batch holds the database's single write lock, so concurrent runs
    interleave batches but never move a row twice.

    Raises:
        ConfigError: `older_than` is not positive, `batch`/`max_batches` < 1, `pause` < 0,
            or an `expect` topic without groups.
        ArchiveBusy: another run holds the lock.
        SchemaError: the outbox table is missing.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    if older_than <= dt.timedelta(0):
        raise ConfigError(f"--older-than must be positive, got {older_than}")
    if batch < 1 or (max_batches is not None and max_batches < 1):
        raise ConfigError("--batch and --max-batches must be at least 1")
    if pause < 0:
        raise ConfigError(f"--pause must not be negative, got {pause}")
    bad = [s.name for s in states if s not in ARCHIVE_STATES]
    if bad:
        raise ConfigError(f"only terminal states can be archived, not {', '.join(bad)}")
    check_tables(engine, tables.outbox, tables.receipts)
    cutoff = (now or utcnow()) - older_than
    c = tables.outbox.c
    guard = sa.and_(
        c.state.in_([int(s) for s in states]) if expect is None
        else sa.and_(c.state == int(OutboxState.CONSUMED), receipts_complete(tables, expect)),
        c.gmt_modified < cutoff,
        # implied by the line above; lets ix_<outbox>_gmt_create bound the scan
        c.gmt_create < cutoff,
    )
    if dry_run:
        with engine.connect() as conn:
            count = conn.scalar(sa.select(sa.func.count()).select_from(tables.outbox).where(guard))
        return ArchiveResult(int(count or 0), 0, cutoff, False, dry_run=True)
    tables.archive.create(engine, checkfirst=True)
    # READ COMMITTED: the batch's locking read locks the rows it picks, not every row and gap
    # its range scan passes (REPEATABLE READ's next-key locks reach the due rows the relay
    # claims and the end of the table where publish inserts)
    batches_engine = read_committed(engine)
    keys = _partition_keys(engine, tables)
    moved = batches = 0
    last_id = 0
    more = False
    # the count outside the lock: an error releasing it (its connection lost with the
    # batch's) must still say what was archived
    with committed_on_error(lambda: counted(moved, "row", "archived", batches)), \
            single_instance(engine, tables.outbox.name):
        while True:
            if max_batches is not None and batches >= max_batches:
                more = True
                break
            count, last_id = _archive_batch(batches_engine, tables, keys, guard, last_id,
                                            batch)
            if count == 0 and last_id == 0:
                break
            moved += count
            batches += 1
            if last_id == 0:  # the selection came back short: nothing older is left
                break
            if pause:
                time.sleep(pause)
    return ArchiveResult(moved, batches, cutoff, more)


def receipts_complete(tables: OutboxTables, expect: Mapping[str, Sequence[str]]
                      ) -> sa.ColumnElement[bool]:
    """True for an outbox row of an `expect` topic whose every expected group has a consumed
    receipt row (one probe of the receipt table's primary key per group).

    Raises:
        ConfigError: `expect` is empty, names a topic without groups, or gives a topic one
            string (read as its letters, it would archive nothing, run after run).
    """
    if not expect or not all(expect.values()):
        raise ConfigError("receipt-driven archiving needs TOPIC=group1,group2 for each topic")
    c, r = tables.outbox.c, tables.receipts.c
    parts = []
    for topic, groups in expect.items():
        wanted = sorted(group_names(topic, groups, what="expect"))
        stored = (sa.select(sa.func.count()).select_from(tables.receipts)
                  .where(r.message_id == c.message_id, r.consumer_group.in_(wanted),
                         r.outcome == ReceiptOutcome.CONSUMED.value)
                  .scalar_subquery())
        parts.append(sa.and_(c.topic == topic, stored == len(wanted)))
    return sa.or_(*parts)


def _partition_keys(engine: Engine, tables: OutboxTables) -> sa.Table | None:
    """The key table of a partitioned outbox (`<outbox>_key`), or None for a plain outbox."""
    name = f"{tables.outbox.name}_key"
    if dialect_name(engine) != "mysql" or not sa.inspect(engine).has_table(name):
        return None
    return key_table(sa.MetaData(), tables.outbox.name)


def _archive_batch(
    engine: Engine, tables: OutboxTables, keys: sa.Table | None, guard: Any, after_id: int,
    batch: int
) -> tuple[int, int]:
    """Move one batch; return (rows moved, id to continue after, or 0 when the scan is done)."""
    outbox, c = tables.outbox, tables.outbox.c
    with engine.begin() as conn:
        query = (sa.select(c.id, c.message_id).where(guard, c.id > after_id).order_by(c.id)
                 .limit(batch))
        if dialect_name(conn) != "sqlite":
            # Lock the picked rows so no operator retry slips between the copy and the delete.
            # SQLite needs no lock: the INSERT takes the single write lock, and both statements
            # repeat the guard, so the copy and the delete see the same rows.
            query = query.with_for_update()
        picked = conn.execute(query).all()
        if not picked:
            return 0, 0
        ids = [int(r.id) for r in picked]
        in_batch = sa.and_(c.id.in_(ids), guard)
        columns = [col.name for col in outbox.columns]
        inserted = conn.execute(
            sa.insert(tables.archive).from_select(
                columns, sa.select(*[outbox.c[n] for n in columns]).where(in_batch)
            ),
            # psycopg forgets an INSERT's row count once SQLAlchemy closes the cursor (-1)
            execution_options={"preserve_rowcount": True},
        ).rowcount
        deleted = conn.execute(sa.delete(outbox).where(in_batch)
                               .execution_options(**{OPTION: "archive"})).rowcount
        if inserted != deleted:
            raise OutboxError(
                f"archive batch after id {after_id}: copied {inserted} rows but deleted {deleted};"
                " rolled back"
            )
        moved = [r.message_id for r in picked]
        for table in (tables.receipts, *([keys] if keys is not None else [])):
            conn.execute(sa.delete(table).where(table.c.message_id.in_(moved)))
        return deleted, (ids[-1] if len(ids) == batch else 0)


@contextlib.contextmanager
def single_instance(engine: Engine, table_name: str) -> Iterator[None]:
    """Hold a server-side lock naming this outbox table for the whole run (see `archive`)."""
    dialect = dialect_name(engine)
    if dialect not in ("mysql", "postgresql"):
        yield
        return
    name = f"ckit_archive:{engine.url.database}.{table_name}"
    if len(name) > 64:  # MySQL's GET_LOCK limit
        name = "ckit_archive:" + hashlib.sha1(name.encode()).hexdigest()
    with engine.connect() as conn:
        if dialect == "mysql":
            got = conn.scalar(sa.select(sa.func.get_lock(name, 0)))
            release = sa.select(sa.func.release_lock(name))
        else:
            key = int.from_bytes(hashlib.sha1(name.encode()).digest()[:8], "big", signed=True)
            got = conn.scalar(sa.select(sa.func.pg_try_advisory_lock(key)))
            release = sa.select(sa.func.pg_advisory_unlock(key))
        conn.commit()
        if not got:
            raise ArchiveBusy(f"another `ckit outbox archive` holds the lock {name!r}; try later")
        try:
            yield
        finally:
            conn.execute(release)
            conn.commit()
