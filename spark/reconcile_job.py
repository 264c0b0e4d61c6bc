"""The PySpark reconcile job: `ckit reconcile` (engine `spark`) and `spark-submit` both run it.

    spark-submit --jars "$(scripts/jdbc.sh jars)" spark/reconcile_job.py \\
        --url mysql+pymysql://app:pw@db/orders --group inventory=mysql+pymysql://...

Flow: fix `now` and the cutoff once on the driver; a bounds query (min/max id, count: an
index-only scan) sizes the partitioned JDBC read of the window; the window's message ids fetch
the ack rows and each group's processed rows through chunked IN predicates (or, for a very large
window, a `processed_at` range read joined in Spark); Spark groups the evidence per message and
joins it to the window; the driver streams the joined rows through the shared rules
(`consumer_kit.reconcile.classify`) into the compare-and-set applier (SQLAlchemy Core, bound
parameters). Orphans: the processed window anti-joined with recent outbox ids, then checked
exactly by message id on the driver.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.errors import ConfigError
from consumer_kit.reconcile.classify import classify
from consumer_kit.reconcile.errors import ReconcileError
from consumer_kit.reconcile.known import KnownIds
from consumer_kit.reconcile.model import (
    IN_CHUNK,
    Evidence,
    Orphan,
    ReconcileConfig,
    WindowRow,
    chunks,
)
from consumer_kit.reconcile.queries import processed_window_conditions
from consumer_kit.reconcile.repair import RepairApplier, RepairResult
from consumer_kit.reconcile.report import ReconcileSummary, SummaryBuilder
from consumer_kit.reconcile.sql_engine import Databases, fetch_evidence
from consumer_kit.schema import processed_table
from consumer_kit.urls import mask_text
from spark.jdbc import JAR_PATTERNS, find_jars, to_jdbc
from spark.reads import (
    EVIDENCE_SCHEMA,
    WindowPart,
    read_evidence_by_ids,
    read_evidence_by_range,
    read_outbox_ids_since,
    read_processed_window,
    read_window,
    split_safe,
    window_bounds,
)

log = logging.getLogger("consumer_kit.reconcile.spark")

#: How far before the window's oldest `sent_at` a large-window range read starts (clock skew,
#: acks that arrive before the relay marked the row SENT).
RANGE_SKEW = dt.timedelta(hours=1)
PROGRESS_EVERY = 10_000
DEFAULT_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # our own progress lines instead of stage bars
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
}

#: In local mode the driver's RPC and block-manager servers stay on loopback (Spark otherwise
#: binds the address its host name resolves to, an external interface). Not for a cluster,
#: whose executors must reach the driver; `--conf` overrides either way.
LOOPBACK_DRIVER_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}

Progress = Callable[[str], None]


def is_local_master(master: str | None) -> bool:
    """True for `local`, `local[N]`, `local[*]` and `local[N,F]` (a driver-only Spark)."""
    return master is not None and (master == "local" or master.startswith("local["))


def build_session(config: ReconcileConfig, dialects: set[str]) -> Any:
    """Start (or join) a SparkSession with the JDBC driver jars on its classpath.

    `spark.jars.packages` in `config.spark_conf` (a cluster) replaces the local jar lookup.

    Raises:
        ConfigError: a JDBC driver jar is missing (names `scripts/jdbc.sh`).
    """
    from pyspark.sql import SparkSession

    user = dict(config.spark_conf)
    conf = dict(DEFAULT_SPARK_CONF)
    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if is_local_master(config.master or (_submitted_master() if submitted else None)):
        conf.update(LOOPBACK_DRIVER_CONF)
    if submitted:
        _check_submitted_jars(user)
    elif "spark.jars.packages" not in user and "spark.jars" not in user:
        conf["spark.jars"] = ",".join(_all_jars(dialects))
    conf.update(user)
    builder = SparkSession.builder.appName("ckit-reconcile")
    if config.master:
        builder = builder.master(config.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _submitted_master() -> str | None:
    """The master spark-submit was given (it runs us with its JVM already up)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM: its conf is in system props
    master = SparkConf().get("spark.master")
    return str(master) if master else None


def _all_jars(dialects: set[str]) -> list[str]:
    """The jars `dialects` need (or ConfigError), plus any other driver found: a later session in
    the same JVM (tests, `ckit demo` then another run) keeps the first session's classpath."""
    jars = find_jars(dialects)
    for other in sorted(set(JAR_PATTERNS) - dialects):
        try:
            jars += [j for j in find_jars({other}) if j not in jars]
        except ConfigError:
            continue
    return jars


def _check_submitted_jars(user: dict[str, str]) -> None:
    """Under spark-submit the driver's classpath is fixed before this code runs: setting
    `spark.jars` now would reach the executors but not the driver, which loads the JDBC driver
    to resolve each read's schema. Fail early with the flag to add instead."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM: its conf is in system props
    submitted = SparkConf()
    keys = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
    if any(submitted.get(k) or user.get(k) for k in keys):
        return
    raise ConfigError(
        'spark-submit was given no JDBC driver: add --jars "$(scripts/jdbc.sh jars)" (Debian\'s '
        "libmariadb-java and libxerial-sqlite-jdbc-java) or --packages "
        "org.mariadb.jdbc:mariadb-java-client:<version>,org.xerial:sqlite-jdbc:<version>")


def run_spark(config: ReconcileConfig, *, now: dt.datetime, progress: Progress,
              spark: Any = None) -> ReconcileSummary:
    """Run the reconcile on Spark. Joins an active SparkSession (tests, spark-submit) or starts
    one (stopped again at the end). See `consumer_kit.reconcile.run_reconcile`."""
    from pyspark.sql import SparkSession

    started = time.monotonic()
    cutoff = now - config.stuck_after
    builder = SummaryBuilder(config, now=now, cutoff=cutoff)
    durations = builder.summary.durations
    producer = to_jdbc(config.producer_url)
    groups = {g.name: to_jdbc(g.url) for g in config.groups}
    session = spark or SparkSession.getActiveSession()
    own_session = session is None
    if session is None:
        progress(f"starting Spark ({config.master or 'spark-submit master'})")
        session = build_session(config, {producer.dialect, *(g.dialect for g in groups.values())})
    durations["spark_start"] = time.monotonic() - started
    builder.summary.details["spark_master"] = session.sparkContext.master
    dbs = Databases()
    cached: list[Any] = []
    try:
        result = _run(session, config, builder, dbs, cutoff, now, producer, groups, cached,
                      progress)
    except Exception as exc:
        if type(exc).__name__ == "Py4JJavaError":  # a JVM stack trace: keep its first line
            raise ReconcileError(f"Spark job failed: {_java_message(exc)}") from exc
        raise
    finally:
        for frame in cached:
            frame.unpersist()
        dbs.dispose()
        if own_session:
            session.stop()
    durations["total"] = time.monotonic() - started
    return builder.finish(result)


def _run(session: Any, config: ReconcileConfig, builder: SummaryBuilder, dbs: Databases,
         cutoff: dt.datetime, now: dt.datetime, producer: Any, groups: dict[str, Any],
         cached: list[Any], progress: Progress) -> RepairResult:
    durations = builder.summary.durations
    engine = dbs.get(config.producer_url)
    applier = RepairApplier(engine, outbox=config.outbox_table, ack=config.ack_table,
                            now=now, dry_run=config.dry_run, batch_size=config.batch_size)
    phase = time.monotonic()
    bounds = window_bounds(engine, config, cutoff)
    durations["bounds"] = time.monotonic() - phase
    sent, sending = bounds["sent"], bounds["sending"]
    total = sent.rows + sending.rows
    builder.summary.details["bounds"] = {name: part._asdict() for name, part in bounds.items()}
    progress(f"window: {total} outbox rows before cutoff {cutoff.isoformat(sep=' ')} "
             f"(SENT ids {sent.min_id}..{sent.max_id}, SENDING {sending.rows})")
    if total:
        _reconcile_window(session, config, builder, applier, dbs, bounds, cutoff, now,
                          producer, groups, cached, progress)
    phase = time.monotonic()
    result = applier.finish()
    durations["repair_flush"] = time.monotonic() - phase
    phase = time.monotonic()
    _find_orphans(session, config, builder, dbs, engine, cutoff, producer, groups, cached,
                  progress)
    durations["orphans"] = time.monotonic() - phase
    return result


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return mask_text(text.strip().splitlines()[0] if text.strip() else type(exc).__name__)


def _reconcile_window(spark: Any, config: ReconcileConfig, builder: SummaryBuilder,
                      applier: RepairApplier, dbs: Databases,
                      bounds: dict[str, WindowPart], cutoff: dt.datetime,
                      now: dt.datetime, producer: Any, groups: dict[str, Any],
                      cached: list[Any], progress: Progress) -> None:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    durations = builder.summary.durations
    phase = time.monotonic()
    window = read_window(spark, producer, config, cutoff, bounds).persist(
        StorageLevel.MEMORY_AND_DISK)
    cached.append(window)
    rows = window.count()
    builder.read("window", rows)
    durations["read_window"] = time.monotonic() - phase
    partitions = window.rdd.getNumPartitions()
    builder.summary.details["window_partitions"] = partitions
    progress(f"read {rows} window rows in {partitions} partition(s) "
             f"({durations['read_window']:.1f}s)")

    phase = time.monotonic()
    if rows <= config.in_list_max:
        ids = [r.message_id for r in window.select("message_id").collect()]
        safe, unsafe = split_safe(ids)
        evidence = read_evidence_by_ids(spark, config, producer, groups, safe)
        if unsafe:  # quotes or control characters: fetched with bound parameters instead
            evidence = evidence.unionByName(_driver_evidence(spark, dbs, config, unsafe, builder))
        builder.summary.details["evidence_read"] = "in_lists"
    else:
        oldest = bounds["sent"].oldest_sent_at or cutoff
        evidence = read_evidence_by_range(spark, config, producer, groups,
                                          since=oldest - RANGE_SKEW, until=now)
        evidence = evidence.join(window.select("message_id"), "message_id", "left_semi")
        builder.summary.details["evidence_read"] = "range"
    evidence = evidence.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(evidence)
    for r in evidence.groupBy("grp", F.col("ack_outcome").isNotNull().alias("ack")).count() \
            .collect():
        builder.read("acks" if r["ack"] else f"processed:{r['grp']}", int(r["count"]))
    per_message = evidence.groupBy("message_id").agg(F.collect_list(F.struct(
        "grp", "processed_status", "processed_error", "ack_outcome", "ack_reason")).alias("ev"))
    joined = window.join(per_message, "message_id", "left").persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(joined)
    joined.count()
    durations["read_evidence"] = time.monotonic() - phase
    progress(f"evidence joined ({durations['read_evidence']:.1f}s); classifying and repairing")

    phase = time.monotonic()
    for done, r in enumerate(joined.toLocalIterator(), start=1):
        row = WindowRow(id=r["id"], message_id=r["message_id"], topic=r["topic"],
                        state=r["state"], retry_count=r["retry_count"],
                        max_retries=r["max_retries"], lock_version=r["lock_version"],
                        sent_at=r["sent_at"], lease_until=r["lease_until"])
        evidence_rows = [Evidence(group=e["grp"], processed_status=e["processed_status"],
                                  processed_error=e["processed_error"],
                                  ack_outcome=e["ack_outcome"], ack_reason=e["ack_reason"])
                         for e in (r["ev"] or ())]
        decision = classify(row, evidence_rows, config.groups, max_retries=config.max_retries)
        builder.decision(decision)
        applier.add(decision)
        if done % PROGRESS_EVERY == 0:
            progress(f"classified {done}/{rows}")
    durations["classify_repair"] = time.monotonic() - phase


def _driver_evidence(spark: Any, dbs: Databases, config: ReconcileConfig, ids: Sequence[str],
                     builder: SummaryBuilder) -> Any:
    rows: list[tuple[str | None, ...]] = []
    for chunk in chunks(ids, IN_CHUNK):
        for message_id, items in fetch_evidence(dbs, config, chunk, builder).items():
            rows.extend((message_id, e.group, e.processed_status, e.processed_error,
                         e.ack_outcome, e.ack_reason) for e in items)
    return spark.createDataFrame(rows, EVIDENCE_SCHEMA)


def _find_orphans(spark: Any, config: ReconcileConfig, builder: SummaryBuilder, dbs: Databases,
                  engine: sa.Engine, cutoff: dt.datetime, producer: Any, groups: dict[str, Any],
                  cached: list[Any], progress: Progress) -> None:
    if config.orphan_window <= dt.timedelta(0):
        return
    since = cutoff - config.orphan_window
    outbox_ids = None
    known_ids = KnownIds(engine, config.outbox_table)
    for group in config.groups:
        conds = processed_window_conditions(processed_table(sa.MetaData(), group.table), group,
                                            since=since, until=cutoff, src=config.src)
        with dbs.get(group.url).connect() as conn:
            count = int(conn.execute(sa.select(sa.func.count()).where(*conds)).scalar() or 0)
        builder.read(f"orphan_scan:{group.name}", count)
        if not count:
            continue
        window = read_processed_window(spark, groups[group.name], config, group.table,
                                       group.name, group.topics, since, cutoff, count)
        if outbox_ids is None:
            # Outbox rows are created before they are processed; the exact check below catches
            # the rare message created before this range (a long delay, many retries) and the
            # messages already moved to the archive.
            outbox_ids = read_outbox_ids_since(spark, engine, producer, config,
                                               since - config.orphan_window).persist()
            cached.append(outbox_ids)
        candidates = window.join(outbox_ids, "message_id", "left_anti").collect()
        for c in known_ids.unknown(candidates, lambda c: str(c["message_id"])):
            builder.orphan(Orphan(group=group.name, message_id=c["message_id"], topic=c["topic"],
                                  status=c["status"], processed_at=c["processed_at"]))
        progress(f"orphan scan {group.name}: {count} processed rows in the window, "
                 f"{len(candidates)} without a recent outbox row")


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry point: the `ckit reconcile` options, the master from spark-submit."""
    from consumer_kit.cli.reconcile import standalone

    return standalone(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
