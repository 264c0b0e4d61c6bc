"""A command given a SQLite file that is not there refuses with one line and makes none.

Connecting to SQLite makes the file: a typo in a path used to be left behind as an empty
database before the "tables are missing" error. `--url` and `--transport sql+...` are checked
before connecting, in each way a URL can name a file: a path, and a `file:` URI (`uri=true`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from consumer_kit.cli.main import app
from tests.cli import error_line

#: SQLite URLs of a file that is not there (`{path}`, or `{name}` in the working folder) in
#: each form the driver opens a file by.
FORMS = {
    "path": "sqlite:///{path}",
    "relative path": "sqlite:///{name}",
    "file: URI": "sqlite:///file:{path}?uri=true",
    "relative file: URI": "sqlite:///file:{name}?uri=true",
    "file:/// URI": "sqlite:///file://{path}?uri=true&mode=rwc",
}

#: Commands taking the SQL transport: `{mq}` is the transport URL, `{ok}` a producer database.
TRANSPORT_COMMANDS = {
    "relay": ["relay", "--url", "{ok}", "--transport", "sql+{mq}", "--once"],
    "receipts": ["receipts", "--url", "{ok}", "--transport", "sql+{mq}", "--producer", "orders",
                 "--burst"],
    "mq purge": ["mq", "purge", "--transport", "sql+{mq}"],
    "consume": ["consume", "examples.inventory:app", "--transport", "sql+{mq}", "--burst"],
}


def ckit(args: list[str], **values: str) -> Result:
    return CliRunner().invoke(app, [a.format(**values) for a in args])


def assert_refused_with_one_line(result: Result, missing: Path) -> None:
    assert result.exit_code == 2, result.output
    line = error_line(result.output)
    assert str(missing.name) in line and "does not exist" in line, line
    assert "folder" not in line, line  # (its folder is there)
    assert not missing.exists(), f"{missing} was made: {line}"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("command", TRANSPORT_COMMANDS)
def test_a_transport_on_a_sqlite_file_that_is_not_there_refuses_and_makes_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, form: str) -> None:
    # Given a producer (and an app) database that works, and a mistyped transport file
    ok, inventory = (f"sqlite:///{tmp_path / name}" for name in ("orders.db", "inventory.db"))
    for url in (ok, inventory):
        assert CliRunner().invoke(app, ["db", "init", "--url", url]).exit_code == 0
    monkeypatch.setenv("INVENTORY_DB_URL", inventory)
    monkeypatch.delitem(sys.modules, "examples.inventory", raising=False)  # (reads it once)
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "ckit-mq-typo.db"
    mq = FORMS[form].format(path=missing, name=missing.name)
    # When the command is given it as its --transport
    result = ckit(TRANSPORT_COMMANDS[command], ok=ok, mq=mq)
    # Then one line naming the file, the exit code of a configuration error, and no file
    assert_refused_with_one_line(result, missing)


@pytest.mark.parametrize("form", [f for f in FORMS if "URI" in f])  # (paths: test_cli_db_outbox)
def test_a_url_naming_a_sqlite_file_by_uri_that_is_not_there_refuses_and_makes_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    # Given a file: URI of a SQLite file that is not there
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "ordres.db"
    # When a command that works on existing tables is given it as its --url
    result = ckit(["outbox", "stats", "--url", FORMS[form]], path=str(missing),
                  name=missing.name)
    # Then it is refused as a path is, and no file is made
    assert_refused_with_one_line(result, missing)


def test_a_transport_on_a_sqlite_file_uri_that_is_there_works(tmp_path: Path) -> None:
    # Given the SQL transport's tables made in a file named by an absolute file: URI
    mq = f"sqlite:///file:{tmp_path / 'mq.db'}?uri=true"
    assert ckit(["db", "init", "--url", mq]).exit_code == 0
    # When a command uses it as its transport (it was refused: "the folder ... does not exist")
    result = ckit(["mq", "purge", "--transport", f"sql+{mq}"])
    # Then it runs
    assert result.exit_code == 0, result.output
    assert "deleted 0 messages" in result.output


def test_a_file_name_without_uri_true_is_refused_with_what_it_needs(tmp_path: Path) -> None:
    # Given a file: URI without ?uri=true (the driver opens a file named "file:/...")
    url = f"sqlite:///file:{tmp_path / 'mq.db'}"
    # When / Then one line says what is missing
    for args in (["db", "init", "--url", url], ["mq", "purge", "--transport", f"sql+{url}"]):
        result = ckit(args)
        assert result.exit_code == 2, result.output
        assert "needs ?uri=true" in error_line(result.output)


def test_a_tilde_in_a_sqlite_url_is_a_folder_name_as_the_driver_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given tables made in ~/orders.db, and a working folder without a folder named "~"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert ckit(["db", "init", "--url", f"sqlite:///{home / 'orders.db'}"]).exit_code == 0
    monkeypatch.chdir(work)
    # When a command is given sqlite:///~/orders.db (the driver opens ./~/orders.db)
    result = ckit(["outbox", "stats", "--url", "sqlite:///~/orders.db"])
    # Then one line says that ~ is not expanded (it passed the check on ~/orders.db, then the
    # driver answered "unable to open database file"), and nothing is made
    assert result.exit_code == 2, result.output
    assert "does not expand ~" in error_line(result.output)
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("form", ["path", "relative path", "file: URI"])
def test_consume_with_an_app_whose_sqlite_file_is_not_there_refuses_and_makes_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    # Given a transport that works and the app's own database URL mistyped (its configuration,
    # not an option of ckit's)
    mq = f"sqlite:///{tmp_path / 'ckit-mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", mq]).exit_code == 0
    missing = tmp_path / "inventroy.db"
    monkeypatch.setenv("INVENTORY_DB_URL", FORMS[form].format(path=missing, name=missing.name))
    monkeypatch.delitem(sys.modules, "examples.inventory", raising=False)  # (reads it once)
    monkeypatch.chdir(tmp_path)
    # When the app is consumed
    result = ckit(TRANSPORT_COMMANDS["consume"], mq=mq)
    # Then one line naming the file and the group, exit 2, and no empty file left behind
    assert_refused_with_one_line(result, missing)
    assert "inventory" in error_line(result.output)
