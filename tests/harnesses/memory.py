"""Harness: the in-process memory transport."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumer_kit.testing.harness import MAX_RECONSUME, unique, wait_for_dead_letters
from consumer_kit.transports import Delivery
from consumer_kit.transports.memory import MemoryTransport


class MemoryHarness:
    timeout = 5.0
    quiet = 0.3

    def __init__(self) -> None:
        self.transport = MemoryTransport(retry_delays=[0.05, 0.1],
                                         max_reconsume_times=MAX_RECONSUME)

    def topic(self, stem: str) -> str:
        return unique(stem)

    def group(self, stem: str) -> str:
        return unique(stem)

    def dead_letters(self, group: str, *, expect: int) -> list[Delivery]:
        return wait_for_dead_letters(lambda: self.transport.dead_letters(group), expect=expect,
                                     timeout=self.timeout)


@contextmanager
def harness(tmp_path: Path) -> Iterator[MemoryHarness]:
    h = MemoryHarness()
    try:
        yield h
    finally:
        h.transport.close()
