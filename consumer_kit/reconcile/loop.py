"""The one reconcile loop: read through a `Source`, classify, repair, check orphans, report.

Both engines run through here, so "what a row is" (`classify`), "how it is repaired"
(`RepairApplier`, the state machine's compare-and-set) and "what is an orphan" (`KnownIds`) are
each written once.
"""

from __future__ import annotations

import datetime as dt
import time

from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.reconcile.classify import classify
from consumer_kit.reconcile.known import KnownIds
from consumer_kit.reconcile.model import IN_CHUNK, Orphan, chunks
from consumer_kit.reconcile.repair import RepairApplier, RepairResult
from consumer_kit.reconcile.report import ReconcileSummary
from consumer_kit.reconcile.source import Source

PROGRESS_EVERY = 10_000


def reconcile(source: Source) -> ReconcileSummary:
    """Run one reconcile over `source`: classify every window row and apply the repairs
    (guarded compare-and-set batches, nothing written on a dry run) on the primary of the
    row's producer database, then report orphans, then evaluate thresholds and write the
    output folder."""
    run = source.run
    config, builder = run.config, run.builder
    durations = builder.summary.durations
    started = time.monotonic()
    appliers = [RepairApplier(run.engines.get(p.url), outbox=config.outbox_table,
                              receipts=config.receipt_table, now=run.now,
                              dry_run=config.dry_run, batch_size=config.batch_size)
                for p in config.producers]
    done = 0
    # repairs commit batch by batch: an error after some (a window read, the orphan lookups,
    # the output folder) carries how many, so the caller does not report "nothing done"
    with committed_on_error(lambda: counted(
            sum(c.applied for a in appliers for c in a.result.counts.values()),
            "repair", "applied")):
        for row, evidence in source.window():
            decision = classify(row, evidence, config.groups, max_retries=config.max_retries,
                                horizon=config.dedupe_horizon)
            builder.decision(decision)
            appliers[row.shard].add(decision)
            done += 1
            if done % PROGRESS_EVERY == 0:
                run.progress(f"classified {done}")
        result = RepairResult()
        for applier in appliers:
            result.add(applier.finish())
        run.progress(f"classified {done} window rows; {result.statements} repair statements")
        durations["window_and_repairs"] = time.monotonic() - started
        phase = time.monotonic()
        for orphan in find_orphans(source):
            builder.orphan(orphan)
        durations["orphans"] = time.monotonic() - phase
        return builder.finish(result)


def find_orphans(source: Source) -> list[Orphan]:
    """Processed rows of the processed window (`cutoff - orphan_window` to `cutoff`) whose
    message id is in no producer database's outbox or archive (looked up on the primaries).
    Report only."""
    run = source.run
    config = run.config
    if config.orphan_window <= dt.timedelta(0):
        return []
    known = [KnownIds(run.engines.get(p.url), config.outbox_table) for p in config.producers]
    since = run.cutoff - config.orphan_window
    found: list[Orphan] = []
    for group in config.groups:
        candidates = list(source.orphan_candidates(group, since))
        for chunk in chunks(candidates, IN_CHUNK):
            present: set[str] = set()
            for producer in known:
                present |= producer.among([c.message_id for c in chunk if
                                           c.message_id not in present])
            found += [c for c in chunk if c.message_id not in present]
    return found
