"""The reconciler's shared model: classes of findings, sources, configuration, window rows.

Both engines (plain SQL and Spark) read the same facts into `WindowRow` + `Evidence`, hand them to
`consumer_kit.reconcile.classify.classify`, and apply the resulting `Decision`s through the same
compare-and-set applier, so the rules live in exactly one place.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from consumer_kit.core.clock import duration_text
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.schema import (
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_PROCESSED_TABLE,
    DEFAULT_RECEIPT_TABLE,
    check_outbox_names,
)

T = TypeVar("T")

DEFAULT_STUCK_AFTER = dt.timedelta(minutes=10)
DEFAULT_ORPHAN_WINDOW = dt.timedelta(hours=1)
DEFAULT_BATCH_SIZE = 500
DEFAULT_SAMPLE_SIZE = 20
#: Message ids per IN list read on the driver (well under SQLite's 32766 bound parameters).
IN_CHUNK = 1000
#: Above this many window rows the Spark engine reads processed rows by time range, not IN lists.
DEFAULT_IN_LIST_MAX = 200_000
DEFAULT_ENGINE = "spark"
DEFAULT_MASTER = "local[*]"
ENGINES = ("spark", "sql")
#: The `updated_by` every repair writes, so operators can find the reconciler's changes.
RECONCILER = "reconciler"
#: A message made longer ago than this is never re-sent (`RepairClass.BEYOND_DEDUPE`): a
#: consumer dedupes by its processed row and Redis done marker, which `ckit processed purge`
#: may delete once 7 days old (`consumer_kit.processed.PURGE_FLOOR`); a day less, for the
#: clocks of the producer, the consumers and the reconciler.
DEDUPE_HORIZON = dt.timedelta(days=6)


class RepairClass(str, enum.Enum):
    """What the reconciler found for one outbox row (or one orphan processed row)."""

    RECEIPT_LOST = "receipt_lost"
    """Processed SUCCEEDED (or a consumed receipt) in every expected group, outbox still SENT
    -> CONSUMED."""
    REJECTED = "rejected"
    """A group's processed row is FAILED (or sent a rejected receipt) -> REJECTED."""
    RETRY = "retry"
    """Not consumed by every group, retries left -> PENDING, retry_count + 1 (re-send)."""
    EXHAUSTED = "exhausted"
    """Not consumed by every group, retries exhausted -> FAILED."""
    STUCK_SENDING = "stuck_sending"
    """SENDING with a lease expired before the cutoff -> PENDING."""
    BEYOND_DEDUPE = "beyond_dedupe"
    """Not consumed by every group, retries left, but made before `DEDUPE_HORIZON`: a group
    without a processed row may have processed it and purged the row since, so a re-send
    could apply it twice. Report only (re-send it by hand: `ckit outbox retry --force`)."""
    UNMATCHED = "unmatched"
    """SENT, but no configured group consumes its topic: report only (a configuration gap)."""
    ORPHAN = "orphan"
    """A processed row with no outbox row: report only."""

    @property
    def repairs(self) -> bool:
        """Whether this class changes the outbox (the others are report only)."""
        return self not in (RepairClass.UNMATCHED, RepairClass.ORPHAN,
                            RepairClass.BEYOND_DEDUPE)

    @property
    def is_failure(self) -> bool:
        """Classes that make the run exit non-zero by default (so cron alerts): rows the
        reconciler gave up on, rows no configured group consumes (a configuration gap), and
        rows it may not re-send (an operator decides)."""
        return self in (RepairClass.REJECTED, RepairClass.EXHAUSTED, RepairClass.UNMATCHED,
                        RepairClass.BEYOND_DEDUPE)


@dataclasses.dataclass(frozen=True)
class GroupSource:
    """One consumer group: where its processed table lives and which topics it consumes.

    `topics` empty means the group is expected to consume every topic of the window.

    >>> GroupSource("inventory", "sqlite:///inv.db").table
    'ckit_processed'
    """

    name: str
    url: str
    table: str = DEFAULT_PROCESSED_TABLE
    topics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ConfigError("consumer group name must not be empty")
        if not self.url:
            raise ConfigError(f"consumer group {self.name!r} has no database URL")
        validate_identifier(self.table, what="processed table")

    def expects(self, topic: str) -> bool:
        """Whether this group is expected to consume messages of `topic`."""
        return not self.topics or topic in self.topics

    @classmethod
    def parse(cls, spec: str, *, table: str = DEFAULT_PROCESSED_TABLE) -> GroupSource:
        """Parse `NAME[:TOPIC,...][@TABLE]=DB_URL` (the `--group` option).

        `table` is the processed table when the spec names none.

        Raises:
            ConfigError: when the spec has no `=`, an empty name/URL or a bad table name.

        >>> GroupSource.parse("billing:PAYMENT@billing_processed=sqlite:///b.db").table
        'billing_processed'
        """
        head, sep, url = spec.partition("=")
        if not sep:
            raise ConfigError(f"--group must be NAME[:TOPIC,...][@TABLE]=DB_URL, got {spec!r}")
        head, at, own_table = head.partition("@")
        name, _, topics = head.partition(":")
        return cls(
            name=name.strip(),
            url=url.strip(),
            table=own_table.strip() if at else table,
            topics=tuple(t.strip() for t in topics.split(",") if t.strip()),
        )


@dataclasses.dataclass(frozen=True)
class Producer:
    """One producer database of the run: where its outbox is written (`url`, where every repair
    goes) and where it is read (`read_url`, a read replica, else `url`). `index` is its place
    in the run's list, carried by each window row (`WindowRow.shard`)."""

    index: int
    url: str
    read_url: str | None = None

    @property
    def scan_url(self) -> str:
        """Where the window, the receipts and the orphan scan's outbox ids are read."""
        return self.read_url or self.url


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Alerting thresholds: the run exits non-zero when one is crossed.

    `None` disables a threshold. `fail_on_failures` makes the failure classes
    (`RepairClass.is_failure`: REJECTED, EXHAUSTED, UNMATCHED, BEYOND_DEDUPE) alert.
    """

    stuck: int | None = None
    orphans: int | None = None
    conflicts: int | None = None
    fail_on_failures: bool = True


@dataclasses.dataclass(frozen=True)
class ReconcileConfig:
    """Everything one reconcile run needs. Build it from the CLI or from code.

    `shards` are further producer databases (the other shards of a sharded outbox),
    reconciled in the same run; `read_urls` are read replicas, one per producer database in
    the order `producer_url, *shards`: the window is read there, every repair goes to the
    primary as a compare-and-set on the `lock_version` read, so a stale row is a conflict.

    >>> cfg = ReconcileConfig(producer_url="sqlite:///orders.db",
    ...                       groups=(GroupSource("inventory", "sqlite:///inv.db"),))
    >>> cfg.engine
    'spark'
    """

    producer_url: str
    groups: tuple[GroupSource, ...]
    outbox_table: str = DEFAULT_OUTBOX_TABLE
    receipt_table: str = DEFAULT_RECEIPT_TABLE
    stuck_after: dt.timedelta = DEFAULT_STUCK_AFTER
    max_retries: int | None = None
    dry_run: bool = False
    output_dir: Path | None = None
    engine: str = DEFAULT_ENGINE
    master: str | None = DEFAULT_MASTER
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    orphan_window: dt.timedelta = DEFAULT_ORPHAN_WINDOW
    src: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    sample_size: int = DEFAULT_SAMPLE_SIZE
    now: dt.datetime | None = None
    spark_conf: tuple[tuple[str, str], ...] = ()
    in_list_max: int = DEFAULT_IN_LIST_MAX
    shards: tuple[str, ...] = ()
    read_urls: tuple[str, ...] = ()
    dedupe_horizon: dt.timedelta = DEDUPE_HORIZON

    def __post_init__(self) -> None:
        if not self.producer_url:
            raise ConfigError("missing the producer database URL (--url or CKIT_DB_URL)")
        urls = [self.producer_url, *self.shards]
        if len(set(urls)) != len(urls):
            raise ConfigError("a producer database is named twice (--url)")
        if self.read_urls and len(self.read_urls) != len(urls):
            raise ConfigError(f"give one --read-url per --url ({len(urls)}), or none; got "
                              f"{len(self.read_urls)}")
        if not self.groups:
            raise ConfigError("give at least one consumer group (--group NAME=DB_URL)")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"consumer groups named twice: {sorted(names)}")
        validate_identifier(self.outbox_table, what="outbox table")
        validate_identifier(self.receipt_table, what="receipt table")
        check_outbox_names(self.outbox_table, self.receipt_table)
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r} (use one of {', '.join(ENGINES)})")
        if self.stuck_after <= dt.timedelta(0):
            raise ConfigError("--stuck-after must be positive")
        if self.dedupe_horizon <= self.stuck_after:
            raise ConfigError(f"--dedupe-horizon {duration_text(self.dedupe_horizon)} must be "
                              f"longer than --stuck-after {duration_text(self.stuck_after)}: "
                              "every stuck message would be made before it, none re-sent")
        if self.max_retries is not None and self.max_retries < 0:
            raise ConfigError("--max-retries must be >= 0")
        if self.batch_size < 1:
            raise ConfigError("batch size must be >= 1")

    @property
    def producers(self) -> tuple[Producer, ...]:
        """Every producer database of the run, `producer_url` first."""
        urls = (self.producer_url, *self.shards)
        return tuple(Producer(i, url, self.read_urls[i] if self.read_urls else None)
                     for i, url in enumerate(urls))


@dataclasses.dataclass(frozen=True)
class WindowRow:
    """One outbox row of the window, as both engines read it (timestamps as text)."""

    id: int
    message_id: str
    topic: str
    state: int
    retry_count: int
    max_retries: int
    lock_version: int
    sent_at: str | None = None
    lease_until: str | None = None
    #: which producer database the row is in (`ReconcileConfig.producers`): repairs go there
    shard: int = 0
    #: made (`gmt_create`) before `now - DEDUPE_HORIZON`: never re-sent (`BEYOND_DEDUPE`)
    before_horizon: bool = False


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What one group recorded for one message: a processed row and/or a receipt row."""

    group: str
    processed_status: str | None = None
    processed_error: str | None = None
    receipt_outcome: str | None = None
    receipt_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The class of one window row and what to write. `missing_receipts` only for RECEIPT_LOST."""

    row: WindowRow
    klass: RepairClass
    reason: str | None = None
    missing_receipts: tuple[str, ...] = ()
    groups_missing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Orphan:
    """A processed row whose message id has no outbox row (report only)."""

    group: str
    message_id: str
    topic: str
    status: str
    processed_at: str | None


def chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """Split `items` into consecutive slices of at most `size` elements."""
    return [items[i : i + size] for i in range(0, len(items), size)]
