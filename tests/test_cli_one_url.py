"""Commands that work on one database, given CKIT_DB_URL holding several (as `ckit relay` and
`ckit reconcile` read it: space separated): one line saying so, nothing made or touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from consumer_kit.cli.main import app


@pytest.mark.parametrize("command", [
    ["outbox", "stats"],
    ["db", "init"],
    ["processed", "purge", "--group", "g"],
    ["receipts", "--producer", "p", "--transport", "sql+sqlite:///mq.db", "--burst"],
], ids=["outbox-stats", "db-init", "processed-purge", "receipts"])
def test_a_single_database_command_refuses_a_ckit_db_url_of_several_urls_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    # Given CKIT_DB_URL exported for a relay serving two shards
    monkeypatch.chdir(tmp_path)
    urls = f"sqlite:///{tmp_path / 'a.db'} sqlite:///{tmp_path / 'b.db'}"
    # When a command that works on one database runs with it
    result = CliRunner().invoke(app, command, env={"CKIT_DB_URL": urls})
    # Then it says what is wrong in one line, exit 2, instead of reading both URLs as one
    # (a database named 'ckit_test postgresql+psycopg://...', a folder 'a.db sqlite:')
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "CKIT_DB_URL" in lines[0] and "2 URLs" in lines[0], lines[0]
    assert "Traceback" not in result.output
    # and nothing was made
    assert sorted(p.name for p in tmp_path.iterdir()) == []
