"""`run_reconcile`: the one entry point `ckit reconcile`, `ckit demo` and code call."""

from __future__ import annotations

import importlib
import logging

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import Engines
from consumer_kit.core.errors import ConfigError
from consumer_kit.reconcile.loop import reconcile
from consumer_kit.reconcile.model import ReconcileConfig
from consumer_kit.reconcile.report import ReconcileSummary, SummaryBuilder
from consumer_kit.reconcile.source import SOURCES, Progress, Run, Source

log = logging.getLogger(__name__)

SPARK_INSTALL_HINT = (
    "the Spark engine needs pyspark: pip install 'consumer-kit[spark]' (or use --engine sql)"
)


def source_class(engine: str) -> type[Source]:
    """The `Source` of an engine name (`SOURCES`), imported on first use.

    Raises:
        ConfigError: unknown engine, or the Spark engine without pyspark.
    """
    target = SOURCES.get(engine)
    if target is None:
        raise ConfigError(f"unknown reconcile engine {engine!r} (valid: {', '.join(SOURCES)})")
    if engine == "spark":
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise ConfigError(SPARK_INSTALL_HINT) from None
    module, _, name = target.partition(":")
    cls: type[Source] = getattr(importlib.import_module(module), name)
    return cls


def run_reconcile(config: ReconcileConfig, *, progress: Progress | None = None
                  ) -> ReconcileSummary:
    """Reconcile the outbox with the consumer groups' processed tables and repair what is stuck.

    Fixes `now` (and so the cutoff, `now - stuck_after`) once, reads the window through the
    engine's `Source`, classifies every row (`consumer_kit.reconcile.classify`), applies guarded
    compare-and-set repairs unless `dry_run`, finds orphans, evaluates the thresholds and writes
    the output folder when one is configured. `summary.exit_code` is non-zero when an alert
    was raised.

    Raises:
        ConfigError: bad configuration, or the Spark engine without pyspark / JDBC drivers.
        ReconcileError: the Spark job failed (repairs already committed stay).
        sqlalchemy.exc.SQLAlchemyError: a database failed (repairs already committed stay).

    >>> cfg = ReconcileConfig(producer_url="sqlite:///orders.db", engine="sql",
    ...                       groups=(GroupSource("inventory", "sqlite:///inv.db"),))
    >>> run_reconcile(cfg).exit_code                                   # doctest: +SKIP
    0
    """
    cls = source_class(config.engine)
    now = config.now or utcnow()
    cutoff = now - config.stuck_after
    report = progress or (lambda message: log.info("reconcile: %s", message))
    engines = Engines()
    run = Run(config=config, now=now, cutoff=cutoff,
              builder=SummaryBuilder(config, now=now, cutoff=cutoff), progress=report,
              engines=engines)
    source = cls(run)
    try:
        summary = reconcile(source)
    except BaseException:
        # the run's own error is the one to report (it says what repairs stay committed): a
        # second one while closing is logged, never raised in its place
        try:
            source.close()
            engines.dispose()
        except Exception as exc:
            log.warning("reconcile: closing after the error failed too: %s", exc)
        raise
    source.close()
    engines.dispose()
    return summary
