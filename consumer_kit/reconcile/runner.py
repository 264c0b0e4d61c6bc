"""`run_reconcile`: the one entry point both `ckit reconcile` and `ckit demo` call."""

from __future__ import annotations

import logging
from collections.abc import Callable

from consumer_kit.clock import utcnow
from consumer_kit.errors import ConfigError
from consumer_kit.reconcile.model import ReconcileConfig
from consumer_kit.reconcile.report import ReconcileSummary

log = logging.getLogger("consumer_kit.reconcile")

SPARK_INSTALL_HINT = (
    "the Spark engine needs pyspark: pip install 'consumer-kit[spark]' (or use --engine sql)"
)


def run_reconcile(
    config: ReconcileConfig, *, progress: Callable[[str], None] | None = None
) -> ReconcileSummary:
    """Reconcile the outbox with the consumer groups' processed tables and repair what is stuck.

    Fixes `now` (and so the cutoff, `now - stuck_after`) once, reads the window, classifies every
    row (see `consumer_kit.reconcile.classify`), applies guarded compare-and-set repairs unless
    `dry_run`, finds orphans, evaluates the thresholds and writes the output folder when one is
    configured. Returns the summary; `summary.exit_code` is non-zero when an alert was raised.

    Raises:
        ConfigError: bad configuration, or the Spark engine without pyspark / JDBC drivers.
        sqlalchemy.exc.SQLAlchemyError: a database failed (repairs already committed stay).

    >>> cfg = ReconcileConfig(producer_url="sqlite:///orders.db", engine="sql",
    ...                       groups=(GroupSource("inventory", "sqlite:///inv.db"),))
    >>> run_reconcile(cfg).exit_code                                   # doctest: +SKIP
    0
    """
    now = config.now or utcnow()
    report = progress or (lambda message: log.info("reconcile: %s", message))
    if config.engine == "sql":
        from consumer_kit.reconcile.sql_engine import run_sql

        return run_sql(config, now=now, progress=report)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigError(SPARK_INSTALL_HINT) from None
    from spark.reconcile_job import run_spark

    return run_spark(config, now=now, progress=report)
