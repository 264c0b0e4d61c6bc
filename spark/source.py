"""The Spark source of the reconciler (`--engine spark`): partitioned JDBC reads joined in Spark.

Fix the window's bounds on the driver (a cheap indexed query), read the window partitioned by
id (of every producer database of a sharded outbox, each from its read replica when it has
one: one union of partitioned reads, one job), read the evidence of its message ids (IN-list
predicates, or for a very large window a `processed_at` range read joined in Spark), group it
per message and join it to the window; the loop (`consumer_kit.reconcile.loop`) classifies and
repairs the joined rows as they stream to the driver (each on its own producer's primary).
Orphan candidates: the processed window anti-joined with recent outbox ids in Spark (the loop
checks the survivors exactly). `spark/reconcile_job.py` is the spark-submit entry.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.errors import ReconcileError
from consumer_kit.core.schema import processed_table
from consumer_kit.core.states import OutboxState
from consumer_kit.core.urls import mask_text
from consumer_kit.reconcile.conditions import processed_window_conditions
from consumer_kit.reconcile.model import IN_CHUNK, Evidence, GroupSource, Orphan, WindowRow, chunks
from consumer_kit.reconcile.source import Run, Source
from consumer_kit.reconcile.sql_source import fetch_evidence
from spark.jdbc import require_literal, to_jdbc
from spark.reads import (
    EVIDENCE_SCHEMA,
    read_evidence_by_ids,
    read_evidence_by_range,
    read_outbox_ids_since,
    read_processed_window,
    read_window,
    split_safe,
    window_bounds,
)
from spark.session import build_session

#: How far before the window's oldest row's creation a large-window range read starts (clock
#: skew between the producer's and the consumers' clocks).
RANGE_SKEW = dt.timedelta(hours=1)


class SparkSource(Source):
    """Reads the facts with Spark. Joins an active SparkSession (tests, spark-submit) or starts
    one, stopped again by `close`.

    Raises:
        ConfigError: a JDBC driver jar is missing, a database Spark cannot read, or a group
            name, topic or `--src` with characters that cannot go into a JDBC query.
    """

    def __init__(self, run: Run, *, spark: Any = None) -> None:
        from pyspark.sql import SparkSession

        super().__init__(run)
        config = run.config
        for group in config.groups:
            require_literal(group.name, "consumer group")
            for topic in group.topics:
                require_literal(topic, "topic")
        if config.src:
            require_literal(config.src, "producer name (--src)")
        self.producers = [to_jdbc(p.scan_url) for p in config.producers]
        self.groups = {g.name: to_jdbc(g.url) for g in config.groups}
        started = time.monotonic()
        session = spark or SparkSession.getActiveSession()
        self.own_session = session is None
        if session is None:
            run.progress(f"starting Spark ({config.master or 'spark-submit master'})")
            session = build_session(config, {*(p.dialect for p in self.producers),
                                             *(g.dialect for g in self.groups.values())})
        self.spark = session
        run.builder.summary.durations["spark_start"] = time.monotonic() - started
        run.builder.summary.details["spark_master"] = session.sparkContext.master
        self.cached: list[Any] = []
        self._outbox_ids: Any = None

    def close(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()
        if self.own_session:
            self.spark.stop()

    def _keep(self, frame: Any) -> Any:
        from pyspark import StorageLevel

        kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self.cached.append(kept)
        return kept

    def window(self) -> Iterator[tuple[WindowRow, Sequence[Evidence]]]:
        with _java_errors():
            yield from self._window()

    def _window(self) -> Iterator[tuple[WindowRow, Sequence[Evidence]]]:
        from pyspark.sql import functions as F

        run = self.run
        config, builder = run.config, run.builder
        durations = builder.summary.durations
        phase = time.monotonic()
        bounds = [window_bounds(run.engines.get(p.scan_url), config, run.cutoff)
                  for p in config.producers]
        durations["bounds"] = time.monotonic() - phase
        details = builder.summary.details
        details["bounds"] = {name: part._asdict() for name, part in bounds[0].items()}
        if len(bounds) > 1:
            details["bounds_by_producer"] = [{name: part._asdict() for name, part in b.items()}
                                             for b in bounds]
        for p, b in zip(config.producers, bounds):
            sent, sending = b["sent"], b["sending"]
            where = f" of producer {p.index}" if len(bounds) > 1 else ""
            run.progress(f"window{where}: {sent.rows + sending.rows} outbox rows before cutoff "
                         f"{run.cutoff.isoformat(sep=' ')} (SENT ids {sent.min_id}.."
                         f"{sent.max_id}, SENDING {sending.rows})")
        parts = [(p.index, b) for p, b in zip(config.producers, bounds)
                 if b["sent"].rows + b["sending"].rows]
        if not parts:
            return
        phase = time.monotonic()
        frames = [read_window(self.spark, self.producers[i], config, run.cutoff, run.horizon,
                              b, shard=i)
                  for i, b in parts]
        window = frames[0]
        for other in frames[1:]:
            window = window.unionByName(other)
        window = self._keep(window)
        rows = window.count()
        builder.read("window", rows)
        durations["read_window"] = time.monotonic() - phase
        builder.summary.details["window_partitions"] = window.rdd.getNumPartitions()
        run.progress(f"read {rows} window rows ({durations['read_window']:.1f}s)")

        phase = time.monotonic()
        if rows <= config.in_list_max:
            by_shard: dict[int, list[str]] = {}
            for r in window.select("message_id", "shard").collect():
                by_shard.setdefault(int(r.shard), []).append(r.message_id)
            own = {i: split_safe(ids) for i, ids in by_shard.items()}
            safe = [m for s, _ in own.values() for m in s]
            evidence = read_evidence_by_ids(
                self.spark, config, [(self.producers[i], s) for i, (s, _) in own.items()],
                self.groups, safe)
            unsafe = {i: u for i, (_, u) in own.items() if u}
            if unsafe:  # quotes or control characters: fetched with bound parameters instead
                evidence = evidence.unionByName(self._driver_evidence(unsafe))
            builder.summary.details["evidence_read"] = "in_lists"
        else:
            # from the first row's creation, not its last send: a re-send (the reconciler's,
            # an operator's retry) moves `sent_at`, and the evidence of its first delivery,
            # hours older, must still be read
            oldest = min((part.oldest_created or part.oldest_sent_at or run.cutoff
                          for _, b in parts for part in b.values() if part.rows),
                         default=run.cutoff)
            since = oldest - RANGE_SKEW
            # a row re-sent long after it was created (an operator's retry) widens the read:
            # say how far it reaches back
            run.progress(f"evidence read from {since:%Y-%m-%d %H:%M} (the window's oldest row "
                         f"created {oldest:%Y-%m-%d %H:%M})")
            evidence = read_evidence_by_range(self.spark, config, self.producers, self.groups,
                                              since=since, until=run.now)
            evidence = evidence.join(window.select("message_id"), "message_id", "left_semi")
            builder.summary.details["evidence_read"] = "range"
            builder.summary.details["evidence_since"] = str(since)
        evidence = self._keep(evidence)
        for r in evidence.groupBy("grp", F.col("receipt_outcome").isNotNull().alias("rc")) \
                .count().collect():
            builder.read("receipts" if r["rc"] else f"processed:{r['grp']}", int(r["count"]))
        per_message = evidence.groupBy("message_id").agg(F.collect_list(F.struct(
            "grp", "processed_status", "processed_error", "receipt_outcome", "receipt_reason",
        )).alias("ev"))
        joined = self._keep(window.join(per_message, "message_id", "left"))
        joined.count()
        durations["read_evidence"] = time.monotonic() - phase
        run.progress(f"evidence joined ({durations['read_evidence']:.1f}s); classifying")
        ranged = builder.summary.details.get("evidence_read") == "range"
        lacking: list[tuple[WindowRow, list[Evidence]]] = []
        for r in joined.toLocalIterator():
            row = WindowRow(**{n: r[n] for n in WindowRow.__dataclass_fields__})
            found = [Evidence(group=e["grp"], processed_status=e["processed_status"],
                              processed_error=e["processed_error"],
                              receipt_outcome=e["receipt_outcome"],
                              receipt_reason=e["receipt_reason"]) for e in (r["ev"] or ())]
            if ranged and _lacks(row, found, config.groups):
                lacking.append((row, found))
                if len(lacking) >= IN_CHUNK:
                    yield from self._read_again(lacking)
                    lacking = []
                continue
            yield row, found
        if lacking:
            yield from self._read_again(lacking)

    def _read_again(self, lacking: list[tuple[WindowRow, list[Evidence]]]
                    ) -> Iterator[tuple[WindowRow, list[Evidence]]]:
        """Rows the range read found no word of some expected group for, with their evidence
        read again by id, whenever it was written: a consumer whose clock is behind the
        producer's by more than `RANGE_SKEW` recorded it before the range's start, and the row
        would be re-sent (or failed) though consumed."""
        details = self.run.builder.summary.details
        details["read_again_by_id"] = details.get("read_again_by_id", 0) + len(lacking)
        by_shard: dict[int, list[str]] = {}
        for row, _ in lacking:
            by_shard.setdefault(row.shard, []).append(row.message_id)
        found: dict[str, list[Evidence]] = {}
        for shard, ids in by_shard.items():
            found.update(fetch_evidence(
                self.run.engines, self.run.config, ids, self.run.builder,
                receipts_url=self.run.config.producers[shard].scan_url))
        for row, evidence in lacking:
            yield row, [*evidence, *found.get(row.message_id, ())]

    def _driver_evidence(self, by_shard: dict[int, list[str]]) -> Any:
        rows: list[tuple[str | None, ...]] = []
        producers = self.run.config.producers
        for shard, ids in by_shard.items():
            for chunk in chunks(ids, IN_CHUNK):
                found = fetch_evidence(self.run.engines, self.run.config, chunk,
                                       self.run.builder, receipts_url=producers[shard].scan_url)
                for message_id, items in found.items():
                    rows.extend((message_id, e.group, e.processed_status, e.processed_error,
                                 e.receipt_outcome, e.receipt_reason) for e in items)
        return self.spark.createDataFrame(rows, EVIDENCE_SCHEMA)

    def orphan_candidates(self, group: GroupSource, since: dt.datetime) -> Iterator[Orphan]:
        with _java_errors():
            yield from self._orphan_candidates(group, since)

    def _orphan_candidates(self, group: GroupSource, since: dt.datetime) -> Iterator[Orphan]:
        run = self.run
        config = run.config
        conds = processed_window_conditions(processed_table(sa.MetaData(), group.table), group,
                                            since=since, until=run.cutoff, src=config.src)
        with run.engines.get(group.url).connect() as conn:
            count = int(conn.execute(sa.select(sa.func.count()).where(*conds)).scalar() or 0)
        run.builder.read(f"orphan_scan:{group.name}", count)
        if not count:
            return
        window = read_processed_window(self.spark, self.groups[group.name], config, group,
                                       since, run.cutoff, count)
        if self._outbox_ids is None:
            # Outbox rows are created before they are processed; the loop's exact check catches
            # the rare message created before this range (a long delay, many retries) and the
            # messages already moved to the archive.
            frames = [read_outbox_ids_since(self.spark, run.engines.get(p.scan_url),
                                            self.producers[p.index], config,
                                            since - config.orphan_window)
                      for p in config.producers]
            ids = frames[0]
            for other in frames[1:]:
                ids = ids.unionByName(other)
            self._outbox_ids = self._keep(ids)
        candidates = window.join(self._outbox_ids, "message_id", "left_anti").collect()
        run.progress(f"orphan scan {group.name}: {count} processed rows in the window, "
                     f"{len(candidates)} without a recent outbox row")
        for c in candidates:
            yield Orphan(group=group.name, message_id=c["message_id"], topic=c["topic"],
                         status=c["status"], processed_at=c["processed_at"])


def _lacks(row: WindowRow, evidence: Sequence[Evidence], groups: Sequence[GroupSource]) -> bool:
    """Whether a SENT row lacks a processed row or receipt of a group expected for it."""
    if row.state != OutboxState.SENT:
        return False
    heard = {e.group for e in evidence if e.processed_status or e.receipt_outcome}
    return any(g.expects(row.topic) and g.name not in heard for g in groups)


@contextlib.contextmanager
def _java_errors() -> Iterator[None]:
    """A failed Spark job raises a JVM stack trace: keep its first line."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ != "Py4JJavaError":
            raise
        java = getattr(exc, "java_exception", None)
        text = str(java.toString()) if java is not None else str(exc)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise ReconcileError(f"Spark job failed: {mask_text(first)}") from None
