"""Harness: the SQL transport on a SQLite file in the test's temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from consumer_kit.testing.harness import MAX_RECONSUME, unique, wait_for_dead_letters
from consumer_kit.transports import Delivery
from consumer_kit.transports.sql import SqlTransport

#: Fast settings for tests: short back-off, short leases (a dead consumer's queues move in ~2 s).
FAST_OPTIONS: dict[str, Any] = {
    "retry_delays": [0.05, 0.1],
    "max_reconsume_times": MAX_RECONSUME,
    "poll_interval": 0.02,
    "lease_seconds": 2.0,
    "create_tables": True,
}


class SqlHarness:
    """The conformance harness for one `SqlTransport`."""

    timeout = 10.0
    quiet = 0.5

    def __init__(self, transport: SqlTransport) -> None:
        self.transport = transport

    def topic(self, stem: str) -> str:
        topic = unique(stem)
        self.transport.ensure_topic(topic)
        return topic

    def group(self, stem: str) -> str:
        return unique(stem)

    def dead_letters(self, group: str, *, expect: int) -> list[Delivery]:
        return wait_for_dead_letters(lambda: self.transport.dead_letters(group), expect=expect,
                                     timeout=self.timeout)


def sqlite_url(tmp_path: Path) -> str:
    """The database URL of the harness's SQLite file (without the `sql+` prefix)."""
    return f"sqlite:///{tmp_path / 'ckit-mq.db'}"


@contextmanager
def harness(tmp_path: Path) -> Iterator[SqlHarness]:
    transport = SqlTransport(sqlite_url(tmp_path), **FAST_OPTIONS)
    try:
        yield SqlHarness(transport)
    finally:
        transport.close()
