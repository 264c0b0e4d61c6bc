"""A retention window given without a unit is seconds, and its refusal says so.

`ckit processed purge --older-than 14` (14 days meant) was refused as "--older-than 14 is under
the safety floor of 7 days": the line read as a contradiction, and the way out it named,
`--force`, purged rows processed 14 seconds ago, so every redelivery after it applied its
effect again. The line now says the number was read as seconds and how to give days.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import invoke, without_ckit_env
from tests.conftest import Db


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    without_ckit_env(monkeypatch)


ckit = invoke


def test_each_floor_refusal_of_a_bare_number_says_it_was_read_as_seconds(
        sqlite_db: Db, tmp_path: Path) -> None:
    url = sqlite_db.url
    results = {
        "processed purge": ckit("processed", "purge", "--url", url, "--group", "g",
                                "--processed-table", sqlite_db.names.processed,
                                "--older-than", "14"),
        "outbox archive": ckit("outbox", "archive", "--url", url, "--outbox-table",
                               sqlite_db.names.outbox, "--older-than", "30"),
        "mq purge": ckit("mq", "purge", "--transport", f"sql+{url}", "--older-than", "72"),
        "partitions rotate": ckit("outbox", "partitions", "rotate", "--url", url,
                                  "--older-than", "14"),
    }
    for command, result in results.items():
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (command, result.output)
        assert "safety floor" in lines[0], (command, lines[0])
        assert "seconds" in lines[0] and "a number without a unit is seconds" in lines[0], \
            (command, lines[0])


def test_a_floor_refusal_with_a_unit_says_nothing_of_seconds(sqlite_db: Db) -> None:
    result = ckit("processed", "purge", "--url", sqlite_db.url, "--group", "g",
                  "--processed-table", sqlite_db.names.processed, "--older-than", "3d")
    assert result.exit_code == 2 and "without a unit" not in result.stderr
