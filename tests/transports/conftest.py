"""One fixture parametrized over every transport backend (dramatiq's pattern).

Each backend has a module `tests/harnesses/<name>.py` with a `harness(tmp_path)` context manager.
Backends whose service is not up skip locally and fail under CI (see tests/services.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harnesses.base import Harness

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sql_sqlite", id="sql-sqlite"),
    pytest.param("sql_mariadb", id="sql-mariadb", marks=pytest.mark.mariadb),
    pytest.param("rocketmq", id="rocketmq", marks=pytest.mark.rocketmq),
]


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    module = importlib.import_module(f"tests.harnesses.{request.param}")
    with module.harness(tmp_path) as h:
        yield h


@pytest.fixture
def h(harness: Harness) -> Harness:
    """Short alias used by the conformance tests."""
    return harness
