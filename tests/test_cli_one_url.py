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
], ids=["outbox-stats", "db-init", "processed-purge"])
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


@pytest.mark.parametrize("command", [
    ["outbox", "stats"],
    ["db", "init"],
    ["outbox", "archive", "--older-than", "30d"],
    ["processed", "purge", "--group", "g"],
], ids=["outbox-stats", "db-init", "outbox-archive", "processed-purge"])
def test_a_single_database_command_given_url_twice_refuses_in_one_line_and_touches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    # Given two producer databases of a sharded service (as `ckit relay --url A --url B` takes)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for name in ("a.db", "b.db"):
        assert runner.invoke(app, ["db", "init", "--url", f"sqlite:///{name}"]).exit_code == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    # When a command that works on one database is given both the same way
    result = runner.invoke(app, [*command, "--url", "sqlite:///a.db", "--url", "sqlite:///b.db"])
    # Then it refuses in one line, exit 2 (click kept the last --url: stats, init, archive or
    # purge of b.db alone, exit 0, as if both were done; `ckit receipts` takes several)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "--url given 2 times" in lines[0] and "one database" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_relay_given_shard_twice_is_refused_not_run_on_the_last(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["relay", "--url", f"sqlite:///{tmp_path / 'a.db'}",
                                      "--transport", "sql+sqlite:///x.db", "--shard", "0/2",
                                      "--shard", "1/2", "--once"])
    assert result.exit_code == 2, result.output
    assert "--shard given 2 times" in result.stderr and "one shard" in result.stderr
