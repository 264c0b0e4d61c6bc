"""The layers hold at import time: the producer half and the core load no consumer module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONSUMER_HALF = ("consumer_kit.app", "consumer_kit.pipeline", "consumer_kit.dedupe",
                 "consumer_kit.listeners", "consumer_kit.processed", "consumer_kit.receipts",
                 "consumer_kit.metrics", "consumer_kit.message")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("statement", ["import outbox_producer", "import consumer_kit.core",
                                       "from outbox_producer import Outbox, Relay, Dispatcher"])
def test_importing_the_producer_side_loads_no_consumer_module_and_no_redis(
        statement: str) -> None:
    modules = loaded_after(statement)
    consumer = sorted(m for m in modules if m.startswith(CONSUMER_HALF))
    assert consumer == []
    assert "redis" not in modules
    assert "consumer_kit.cli" not in modules


def test_the_public_consumer_names_load_on_first_use() -> None:
    modules = loaded_after("from consumer_kit import ConsumerApp")
    assert "consumer_kit.app" in modules


MAX_MODULE_LINES = 400


def test_no_module_of_the_packages_is_over_400_lines() -> None:
    # Given every module of the three packages
    modules = [p for package in ("consumer_kit", "outbox_producer", "spark")
               for p in (ROOT / package).rglob("*.py")]
    assert len(modules) > 50
    # Then none is longer than one idea should need
    long = {str(p.relative_to(ROOT)): n for p in modules
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}
