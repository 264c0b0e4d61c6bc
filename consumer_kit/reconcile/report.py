"""The run's outcome: counts per class, samples, thresholds, the JSON summary and the exit code."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any

from consumer_kit.core.urls import mask_url
from consumer_kit.reconcile.model import (
    Decision,
    Orphan,
    ReconcileConfig,
    RepairClass,
    Thresholds,
)
from consumer_kit.reconcile.repair import RepairResult

log = logging.getLogger(__name__)

EXIT_OK = 0
#: Exit code when a threshold is crossed or a failure class is present (cron alerts on it).
EXIT_ALERT = 3


@dataclasses.dataclass
class ClassCount:
    """Per class: rows found, repairs intended, applied, and conflicts."""

    found: int = 0
    intended: int = 0
    applied: int = 0
    #: a dry run's: nothing was tried, so nothing conflicted
    dry_run: bool = False

    @property
    def conflicts(self) -> int:
        """Intended repairs that the compare-and-set refused (the row moved); none in a dry
        run, which tries none."""
        return 0 if self.dry_run else self.intended - self.applied


@dataclasses.dataclass
class ReconcileSummary:
    """What one reconcile run found and did. `exit_code` is what `ckit reconcile` exits with."""

    engine: str
    dry_run: bool
    now: dt.datetime
    cutoff: dt.datetime
    producer: str
    groups: list[dict[str, Any]]
    classes: dict[RepairClass, ClassCount] = dataclasses.field(
        default_factory=lambda: {k: ClassCount() for k in RepairClass})
    rows_read: dict[str, int] = dataclasses.field(default_factory=dict)
    durations: dict[str, float] = dataclasses.field(default_factory=dict)
    samples: dict[RepairClass, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    conflict_samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    receipts_inserted: int = 0
    statements: int = 0
    alerts: list[str] = dataclasses.field(default_factory=list)
    output_dir: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def window_rows(self) -> int:
        """Outbox rows found in the window (every class but orphans)."""
        return sum(c.found for k, c in self.classes.items() if k is not RepairClass.ORPHAN)

    @property
    def conflicts(self) -> int:
        """Repairs refused by the compare-and-set, all classes."""
        return sum(c.conflicts for c in self.classes.values())

    @property
    def total_rows_read(self) -> int:
        """Rows read from every source (window, receipts, processed, orphan scan)."""
        return sum(self.rows_read.values())

    @property
    def exit_code(self) -> int:
        """`EXIT_ALERT` when an alert was raised, else `EXIT_OK`."""
        return EXIT_ALERT if self.alerts else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (no samples: they go to their own files)."""
        return {
            "engine": self.engine,
            "dry_run": self.dry_run,
            "now": self.now.isoformat(sep=" "),
            "cutoff": self.cutoff.isoformat(sep=" "),
            "producer": self.producer,
            "groups": self.groups,
            "window_rows": self.window_rows,
            "classes": {
                k.value: {"found": c.found, "intended": c.intended, "applied": c.applied,
                          "conflicts": c.conflicts}
                for k, c in self.classes.items()
            },
            "conflicts": self.conflicts,
            "conflict_samples": self.conflict_samples,
            "receipts_inserted": self.receipts_inserted,
            "statements": self.statements,
            "rows_read": self.rows_read,
            "durations_s": {k: round(v, 3) for k, v in self.durations.items()},
            "alerts": self.alerts,
            "exit_code": self.exit_code,
            "output_dir": self.output_dir,
            "details": self.details,
        }


class SummaryBuilder:
    """Collects decisions and orphans while an engine runs; `finish` evaluates thresholds."""

    def __init__(self, config: ReconcileConfig, *, now: dt.datetime, cutoff: dt.datetime) -> None:
        self.config = config
        self.summary = ReconcileSummary(
            engine=config.engine,
            dry_run=config.dry_run,
            now=now,
            cutoff=cutoff,
            producer=", ".join(
                mask_url(p.url) + (f" (read from {mask_url(p.read_url)})" if p.read_url else "")
                for p in config.producers),
            groups=[{"name": g.name, "url": mask_url(g.url), "table": g.table,
                     "topics": list(g.topics)} for g in config.groups],
            classes={k: ClassCount(dry_run=config.dry_run) for k in RepairClass},
        )

    def decision(self, d: Decision) -> None:
        """Count one classified window row and keep it as a sample if there is room."""
        self.summary.classes[d.klass].found += 1
        self._sample(d.klass, {
            "id": d.row.id, "message_id": d.row.message_id, "topic": d.row.topic,
            "state": d.row.state, "retry_count": d.row.retry_count,
            "max_retries": d.row.max_retries, "lock_version": d.row.lock_version,
            "sent_at": d.row.sent_at, "lease_until": d.row.lease_until, "reason": d.reason,
            "shard": d.row.shard,
            "missing_receipts": list(d.missing_receipts), "groups_missing": list(d.groups_missing),
        })

    def orphan(self, o: Orphan) -> None:
        """Count one orphan processed row."""
        self.summary.classes[RepairClass.ORPHAN].found += 1
        self._sample(RepairClass.ORPHAN, dataclasses.asdict(o))

    def read(self, source: str, rows: int) -> None:
        """Add `rows` read from `source` (window, receipts, processed:<group>, orphan_scan)."""
        self.summary.rows_read[source] = self.summary.rows_read.get(source, 0) + rows

    def _sample(self, klass: RepairClass, row: dict[str, Any]) -> None:
        bucket = self.summary.samples.setdefault(klass, [])
        if len(bucket) < self.config.sample_size:
            bucket.append(row)

    def finish(self, result: RepairResult) -> ReconcileSummary:
        """Merge the repair counts, evaluate thresholds, write the output folder."""
        s = self.summary
        for klass, count in result.counts.items():
            s.classes[klass].intended = count.intended
            s.classes[klass].applied = count.applied
        s.receipts_inserted = result.receipts_inserted
        s.statements = result.statements
        s.conflict_samples = [{"class": k.value, "id": i, "message_id": m}
                              for k, i, m in result.conflict_ids]
        s.alerts = evaluate(s, self.config.thresholds)
        for alert in s.alerts:
            log.warning("reconcile alert: %s", alert)
        if self.config.output_dir is not None:
            write_output(s, self.config.output_dir)
        return s


def evaluate(s: ReconcileSummary, t: Thresholds) -> list[str]:
    """Return one line per alert: crossed thresholds and (by default) failure classes found."""
    alerts: list[str] = []
    if t.stuck is not None and s.window_rows > t.stuck:
        alerts.append(f"{s.window_rows} outbox rows stuck past the cutoff (threshold {t.stuck})")
    orphans = s.classes[RepairClass.ORPHAN].found
    if t.orphans is not None and orphans > t.orphans:
        alerts.append(f"{orphans} orphan processed rows (threshold {t.orphans})")
    if t.conflicts is not None and s.conflicts > t.conflicts:
        alerts.append(f"{s.conflicts} repair conflicts (threshold {t.conflicts})")
    if t.fail_on_failures:
        for klass in RepairClass:
            if klass.is_failure and s.classes[klass].found:
                alerts.append(f"{s.classes[klass].found} rows of failure class {klass.value}")
    return alerts


def write_output(s: ReconcileSummary, root: Path) -> Path:
    """Write `summary.json` and `samples/<class>.jsonl` into a new folder under `root`.

    The folder is `root/run-<UTC time>`; `root/latest.json` is a copy of its summary, replaced
    whole (renamed over the last one), so a reader never sees half a summary.
    """
    run_dir = root / f"run-{s.now.strftime('%Y%m%dT%H%M%S%fZ')}"
    samples_dir = run_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)
    s.output_dir = str(run_dir)
    for klass, rows in s.samples.items():
        with (samples_dir / f"{klass.value}.jsonl").open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=str, sort_keys=True) + "\n")
    text = json.dumps(s.to_dict(), default=str, indent=2, sort_keys=True)
    (run_dir / "summary.json").write_text(text + "\n", encoding="utf-8")
    # written beside it, then renamed over it: a monitor reading latest.json while a run ends
    # (or after a disk filled mid-write) reads the last whole summary, never half of one
    partial = root / f".latest.json.{os.getpid()}.tmp"
    try:
        partial.write_text(text + "\n", encoding="utf-8")
        os.replace(partial, root / "latest.json")
    finally:
        partial.unlink(missing_ok=True)
    return run_dir
