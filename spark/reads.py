"""The Spark source's reads: partitioned JDBC reads of the window, the evidence and the orphans.

Spark's JDBC reader takes no bind parameters, so each subquery is the shared SQLAlchemy select of
`consumer_kit.reconcile.conditions` compiled with literal values (`spark.jdbc.compiled`); the
per-partition predicates carry only validated names and `spark.jdbc.literal`s. Every count and
bound comes from a cheap indexed query on the driver.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from consumer_kit.core.schema import outbox_table, processed_table
from consumer_kit.reconcile.conditions import (
    HORIZON_COLUMN,
    WINDOW_COLUMNS,
    processed_window_select,
    window_conditions,
    window_select,
)
from consumer_kit.reconcile.model import GroupSource, ReconcileConfig
from spark.jdbc import JdbcSource, compiled, literal, require_literal, timestamp_literal

ROWS_PER_PARTITION = 50_000
MIN_ROWS_PER_PARTITION = 2_000
MAX_PARTITIONS = 64
MIN_IDS_PER_PREDICATE = 1_000
#: SQLite's JDBC metadata maps BIGINT/DATETIME badly; timestamps are read as text everywhere.
WINDOW_SCHEMA = ("id BIGINT, state INT, retry_count INT, max_retries INT, lock_version INT, "
                 "sent_at STRING, lease_until STRING, before_horizon INT")
RECEIPT_QUERY = ("(SELECT message_id, consumer_group, outcome, reason, received_at "
                 "FROM {table}) a")
PROCESSED_QUERY = ("(SELECT message_id, consumer_group, status, error, processed_at "
                   "FROM {table}) p")
EVIDENCE_SCHEMA = ("message_id STRING, grp STRING, processed_status STRING, "
                   "processed_error STRING, receipt_outcome STRING, receipt_reason STRING")


def partitions_for(rows: int, parallelism: int = 1) -> int:
    """Partitions for `rows` rows: one per `ROWS_PER_PARTITION`, at least one per core while each
    gets `MIN_ROWS_PER_PARTITION`, at most `MAX_PARTITIONS`."""
    by_size = math.ceil(rows / ROWS_PER_PARTITION)
    spread = min(parallelism, math.ceil(rows / MIN_ROWS_PER_PARTITION))
    return max(1, min(MAX_PARTITIONS, max(by_size, spread)))


def jdbc_read(spark: Any, src: JdbcSource, table: str, *, schema: str | None = None,
              partition: tuple[str, int, int, int] | None = None,
              predicates: Sequence[str] | None = None) -> Any:
    """A JDBC DataFrame over `table` (a table name or `(subquery) alias`).

    `partition` is `(column, lower, upper, partitions)`; `predicates` one WHERE clause per
    partition. `schema` is a `customSchema`.
    """
    options = dict(src.options())
    if schema:
        options["customSchema"] = schema
    if predicates is not None:
        return spark.read.jdbc(src.url, table, predicates=list(predicates), properties=options)
    reader = spark.read.format("jdbc").options(**options).option("dbtable", table)
    if partition is not None:
        column, lower, upper, count = partition
        reader = (reader.option("partitionColumn", column).option("lowerBound", str(lower))
                  .option("upperBound", str(upper)).option("numPartitions", str(count)))
    return reader.load()


class WindowPart(NamedTuple):
    """One part of the window (`sent` or `sending`) as the bounds query found it."""

    min_id: int
    max_id: int
    rows: int
    oldest_sent_at: dt.datetime | None
    #: the oldest `gmt_create` of the part: no consumer can have processed one of its messages
    #: before that
    oldest_created: dt.datetime | None = None


def window_bounds(engine: sa.Engine, config: ReconcileConfig,
                  cutoff: dt.datetime) -> dict[str, WindowPart]:
    """`{"sent": WindowPart, "sending": WindowPart}`: min/max id, row count, oldest `sent_at`
    and oldest `gmt_create` of each part of the window (`window_conditions`; the rows the
    window read reads next)."""
    t = outbox_table(sa.MetaData(), config.outbox_table)
    bounds: dict[str, WindowPart] = {}
    with engine.connect() as conn:
        for name, cond in window_conditions(t, cutoff).items():
            lo, hi, count, oldest, created = conn.execute(
                sa.select(sa.func.min(t.c.id), sa.func.max(t.c.id), sa.func.count(),
                          sa.func.min(t.c.sent_at), sa.func.min(t.c.gmt_create))
                .where(cond)).one()
            bounds[name] = WindowPart(int(lo or 0), int(hi or 0), int(count or 0), oldest,
                                      created)
    return bounds


def read_window(spark: Any, src: JdbcSource, config: ReconcileConfig, cutoff: dt.datetime,
                horizon: dt.datetime, bounds: dict[str, WindowPart], *, shard: int = 0) -> Any:
    """The window of one producer database as one DataFrame: SENT before the cutoff
    (partitioned by id over the bounds) union SENDING with a lease expired before the cutoff
    (usually a handful of rows), with a `shard` column naming the database and
    `before_horizon` (`window_columns`: made before `horizon`, never re-sent).

    Called only when `bounds` holds at least one row."""
    from pyspark.sql import functions as F

    outbox = outbox_table(sa.MetaData(), config.outbox_table)
    cores = int(spark.sparkContext.defaultParallelism)
    frames = []
    for part, spread in (("sent", cores), ("sending", 1)):
        found = bounds[part]
        if found.rows:
            query = compiled(window_select(outbox, part, cutoff, horizon), src.dialect,
                             alias=f"w_{part}")
            frames.append(jdbc_read(spark, src, query, schema=WINDOW_SCHEMA, partition=(
                "id", found.min_id, found.max_id + 1, partitions_for(found.rows, spread))))
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return (frame.select(*WINDOW_COLUMNS, HORIZON_COLUMN)
            .withColumn(HORIZON_COLUMN, F.col(HORIZON_COLUMN) == 1)
            .withColumn("shard", F.lit(shard)))


def id_predicates(column: str, ids: Sequence[str], prefix: str) -> list[str]:
    """`prefix AND column IN ('a', 'b', ...)` clauses, one per partition (ids must be safe)."""
    per = max(MIN_IDS_PER_PREDICATE, math.ceil(len(ids) / MAX_PARTITIONS))
    out = []
    for i in range(0, len(ids), per):
        quoted = ", ".join(f"'{m}'" for m in ids[i : i + per])
        out.append(f"{prefix} AND {column} IN ({quoted})")
    return out


def read_evidence_by_ids(spark: Any, config: ReconcileConfig,
                         receipts_from: Sequence[tuple[JdbcSource, Sequence[str]]],
                         groups: dict[str, JdbcSource], ids: Sequence[str]) -> Any:
    """Each group's processed rows for the window's (safe) message `ids`, and the receipt rows
    of each producer database in `receipts_from` for its own ids (a sharded outbox keeps the
    receipts of its messages beside them)."""
    names = ", ".join(require_literal(g.name, "consumer group") for g in config.groups)
    frames = []
    for producer, own in receipts_from:
        if own:
            preds = id_predicates("message_id", own, f"consumer_group IN ({names})")
            receipts = jdbc_read(spark, producer,
                                 RECEIPT_QUERY.format(table=config.receipt_table),
                                 schema="received_at STRING", predicates=preds)
            frames.append(_receipt_evidence(receipts))
    if ids:
        for group in config.groups:
            prefix = f"consumer_group = {require_literal(group.name, 'consumer group')}"
            processed = jdbc_read(spark, groups[group.name],
                                  PROCESSED_QUERY.format(table=group.table),
                                  schema="processed_at STRING",
                                  predicates=id_predicates("message_id", ids, prefix))
            frames.append(_processed_evidence(processed, group.name))
    return _union(spark, frames)


def read_evidence_by_range(spark: Any, config: ReconcileConfig,
                           producers: Sequence[JdbcSource], groups: dict[str, JdbcSource],
                           since: dt.datetime, until: dt.datetime) -> Any:
    """Evidence for a large window: processed rows with `processed_at >= since` read in time
    slices (the `processed_at` index), receipts with `received_at >= since` from every
    producer database; joined in Spark."""
    names = ", ".join(require_literal(g.name, "consumer group") for g in config.groups)
    slices = time_slices(since, until, MAX_PARTITIONS // 4 or 1)
    frames = []
    for producer in producers:
        receipts = jdbc_read(spark, producer, RECEIPT_QUERY.format(table=config.receipt_table),
                             schema="received_at STRING", predicates=[
            f"consumer_group IN ({names}) AND received_at >= {timestamp_literal(since)}"])
        frames.append(_receipt_evidence(receipts))
    for group in config.groups:
        prefix = f"consumer_group = {require_literal(group.name, 'consumer group')}"
        processed = jdbc_read(spark, groups[group.name],
                              PROCESSED_QUERY.format(table=group.table),
                              schema="processed_at STRING",
                              predicates=[f"{prefix} AND {s}" for s in slices])
        frames.append(_processed_evidence(processed, group.name))
    return _union(spark, frames)


def time_slices(since: dt.datetime, until: dt.datetime, count: int) -> list[str]:
    """`processed_at` range clauses covering `[since, +inf)` in `count` slices."""
    step = (until - since) / count
    edges = [since + step * i for i in range(count)]
    clauses = []
    for i, start in enumerate(edges):
        clause = f"processed_at >= {timestamp_literal(start)}"
        if i + 1 < len(edges):
            clause += f" AND processed_at < {timestamp_literal(edges[i + 1])}"
        clauses.append(clause)
    return clauses


def read_processed_window(spark: Any, src: JdbcSource, config: ReconcileConfig,
                          group: GroupSource, since: dt.datetime, until: dt.datetime,
                          rows: int) -> Any:
    """A group's processed rows of the orphan scan's window (`processed_window_select`), read
    in `processed_at` slices."""
    processed = processed_table(sa.MetaData(), group.table)
    query = compiled(processed_window_select(processed, group, since=since, until=until,
                                             src=config.src), src.dialect, alias="pw")
    slices = time_slices(since, until, partitions_for(rows))
    slices[-1] += f" AND processed_at < {timestamp_literal(until)}"
    return jdbc_read(spark, src, query, schema="processed_at STRING", predicates=slices)


def read_outbox_ids_since(spark: Any, engine: sa.Engine, src: JdbcSource,
                          config: ReconcileConfig, since: dt.datetime) -> Any:
    """Outbox message ids created since `since`, partitioned by id (the `gmt_create` index)."""
    t = outbox_table(sa.MetaData(), config.outbox_table)
    with engine.connect() as conn:
        lo, hi, count = conn.execute(
            sa.select(sa.func.min(t.c.id), sa.func.max(t.c.id), sa.func.count())
            .where(t.c.gmt_create >= since)).one()
    query = compiled(sa.select(t.c.id, t.c.message_id).where(t.c.gmt_create >= since),
                     src.dialect, alias="ob")
    return jdbc_read(spark, src, query, schema="id BIGINT",
                     partition=("id", int(lo or 0), int(hi or 0) + 1,
                                partitions_for(int(count or 0)))).select("message_id")


def split_safe(ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """Ids that can be quoted as literals, and those that must go through bound parameters."""
    safe: list[str] = []
    unsafe: list[str] = []
    for m in ids:
        (safe if literal(m) is not None else unsafe).append(m)
    return safe, unsafe


def _receipt_evidence(frame: Any) -> Any:
    """Receipt rows in the evidence schema (`EVIDENCE_SCHEMA`)."""
    from pyspark.sql import functions as F

    return frame.select(
        "message_id", F.col("consumer_group").alias("grp"),
        F.lit(None).cast("string").alias("processed_status"),
        F.lit(None).cast("string").alias("processed_error"),
        F.col("outcome").alias("receipt_outcome"), F.col("reason").alias("receipt_reason"))


def _processed_evidence(frame: Any, group: str) -> Any:
    """One group's processed rows in the evidence schema."""
    from pyspark.sql import functions as F

    return frame.select(
        "message_id", F.lit(group).alias("grp"),
        F.col("status").alias("processed_status"), F.col("error").alias("processed_error"),
        F.lit(None).cast("string").alias("receipt_outcome"),
        F.lit(None).cast("string").alias("receipt_reason"))


def _union(spark: Any, frames: list[Any]) -> Any:
    if not frames:
        return spark.createDataFrame([], EVIDENCE_SCHEMA)
    out = frames[0]
    for other in frames[1:]:
        out = out.unionByName(other)
    return out
