"""The one interface both reconcile engines implement: where the facts come from.

A `Source` reads the window (outbox rows stuck past the cutoff, each with the evidence every
group recorded: processed rows and receipt rows) and the orphan candidates (processed rows of
the processed window that may have no outbox row). It decides nothing: the loop in
`consumer_kit.reconcile.loop` classifies, repairs and checks orphans the same way for every
source. `sql` is `consumer_kit.reconcile.sql_source.SqlSource`; `spark` is
`spark.source.SparkSource` (the `spark/` package, loaded by name when chosen).
"""

from __future__ import annotations

import abc
import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator, Sequence

from consumer_kit.core.db import Engines
from consumer_kit.reconcile.model import (
    Evidence,
    GroupSource,
    Orphan,
    ReconcileConfig,
    WindowRow,
)
from consumer_kit.reconcile.report import SummaryBuilder

Progress = Callable[[str], None]


@dataclasses.dataclass
class Run:
    """What a source needs from the run: the configuration, the fixed clock, where to count
    rows read and phase durations, progress lines, and one engine per database URL."""

    config: ReconcileConfig
    now: dt.datetime
    cutoff: dt.datetime
    builder: SummaryBuilder
    progress: Progress
    engines: Engines

    @property
    def horizon(self) -> dt.datetime:
        """Rows made before this are never re-sent (`ReconcileConfig.dedupe_horizon`, by
        default `DEDUPE_HORIZON`, before `now`)."""
        return self.now - self.config.dedupe_horizon


class Source(abc.ABC):
    """Reads the facts of one reconcile run."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @abc.abstractmethod
    def window(self) -> Iterator[tuple[WindowRow, Sequence[Evidence]]]:
        """Every window row (SENT before the cutoff, SENDING with a lease expired before it)
        with the evidence of every configured group for its message id."""

    @abc.abstractmethod
    def orphan_candidates(self, group: GroupSource, since: dt.datetime
                          ) -> Iterator[Orphan]:
        """Processed rows of `group` with `since <= processed_at < cutoff` (only from the
        producer `config.src` when set, only the group's topics when it names any) that may
        have no outbox row. A source may drop rows it knows have one; the loop checks the rest
        exactly against the outbox and its archive."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the source holds (cached frames, a Spark session it started)."""


#: The sources by engine name: `module:attribute`, imported when chosen (Spark is optional).
SOURCES = {
    "sql": "consumer_kit.reconcile.sql_source:SqlSource",
    "spark": "spark.source:SparkSource",
}
