"""The reconciler: finds outbox rows stuck past a cutoff, classifies them against every consumer
group's processed table, and repairs them with guarded compare-and-set batches.

Two engines share the model, the rules (`classify`), the repair applier and the report: `sql`
(SQLAlchemy only) and `spark` (the PySpark job in `spark/`, imported lazily).

>>> from consumer_kit.reconcile import GroupSource, ReconcileConfig, run_reconcile
>>> summary = run_reconcile(ReconcileConfig(
...     producer_url="sqlite:///orders.db", engine="sql",
...     groups=(GroupSource("inventory", "sqlite:///inventory.db"),)))  # doctest: +SKIP
"""

from __future__ import annotations

from consumer_kit.core.errors import ReconcileError
from consumer_kit.reconcile.classify import classify
from consumer_kit.reconcile.model import (
    DEFAULT_STUCK_AFTER,
    Decision,
    Evidence,
    GroupSource,
    Orphan,
    ReconcileConfig,
    RepairClass,
    Thresholds,
    WindowRow,
)
from consumer_kit.reconcile.report import EXIT_ALERT, EXIT_OK, ClassCount, ReconcileSummary
from consumer_kit.reconcile.run import run_reconcile

__all__ = [
    "DEFAULT_STUCK_AFTER",
    "EXIT_ALERT",
    "EXIT_OK",
    "ClassCount",
    "Decision",
    "Evidence",
    "GroupSource",
    "Orphan",
    "ReconcileConfig",
    "ReconcileError",
    "ReconcileSummary",
    "RepairClass",
    "Thresholds",
    "WindowRow",
    "classify",
    "run_reconcile",
]
