"""`ckit consume` and the transport URL it is given (`--transport`, `CKIT_TRANSPORT`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import consumer_kit.app as app_module
from consumer_kit import ConsumerApp
from consumer_kit.cli.main import app
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.schema import processed_table
from consumer_kit.transports.sql import SqlTransport
from tests.cli import error_line

APP_WITH_OBJECT = """
from consumer_kit import ConsumerApp
from consumer_kit.transports.sql import SqlTransport
app = ConsumerApp(group="g_obj", db="sqlite:///{db}", receipts=None,
                  transport=SqlTransport("sqlite:///{mq}", create_tables=True,
                                         retry_delays=(120.0,)))
app.listener("T")(lambda msg: None)
"""

APP_WITH_URL = """
from consumer_kit import ConsumerApp
app = ConsumerApp(group="g_url", db="sqlite:///{db}", receipts=None,
                  transport="sql+sqlite:///{mq}")
app.listener("T")(lambda msg: None)
"""


def write_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> str:
    db = tmp_path / "c.db"
    processed_table(sa.MetaData()).create(sa.create_engine(f"sqlite:///{db}"))
    (tmp_path / f"{name}.py").write_text(text.format(db=db, mq=tmp_path / "mq.db"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return f"{name}:app"


def test_a_url_that_would_replace_the_apps_own_transport_object_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an app that builds its own transport object (with options no URL carries)
    target = write_app(tmp_path, monkeypatch, "objapp", APP_WITH_OBJECT)
    # When a transport URL, with a password, is given on top
    url = "sql+mysql+pymysql://ckit:S3cr3tPw@127.0.0.1:1/mq"
    result = CliRunner().invoke(app, ["consume", target, "--transport", url,
                                      "--max-seconds", "1"])
    # Then nothing starts: one line that says why, the password masked
    assert result.exit_code == 2
    line = error_line(result.output)
    assert "would replace the SqlTransport app g_obj builds itself" in line
    assert "S3cr3tPw" not in result.output
    sys.modules.pop("objapp", None)


def test_the_environment_variable_leaves_the_apps_own_object_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an app with its own transport object, and CKIT_TRANSPORT exported (the relay and
    # the receipts read it too) naming another database
    target = write_app(tmp_path, monkeypatch, "objapp2", APP_WITH_OBJECT.replace("g_obj", "g2"))
    other = tmp_path / "other.db"
    # When the app runs
    result = CliRunner().invoke(app, ["consume", target, "--max-seconds", "1"],
                                env={"CKIT_TRANSPORT": f"sql+sqlite:///{other}"})
    # Then it consumes through its own object, and says the variable was not used
    assert result.exit_code == 0, result.output
    assert "CKIT_TRANSPORT is set, but app objapp2:app builds its own SqlTransport" \
        in result.output + caplog.text
    assert not other.exists()
    sys.modules.pop("objapp2", None)


def test_the_library_refuses_a_url_over_a_transport_object_too(tmp_path: Path) -> None:
    transport = SqlTransport(f"sqlite:///{tmp_path / 'mq.db'}", create_tables=True)
    consumer = ConsumerApp(group="g_lib", db=f"sqlite:///{tmp_path / 'c.db'}", receipts=None,
                           transport=transport)
    try:
        with pytest.raises(ConfigError, match="would replace the SqlTransport"):
            consumer.transport(f"sql+sqlite:///{tmp_path / 'other.db'}")
        assert consumer.transport() is transport
    finally:
        consumer.close()


def test_a_url_over_a_url_is_opened_once(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an app configured with a URL, and another URL given to ckit consume
    target = write_app(tmp_path, monkeypatch, "urlapp", APP_WITH_URL)
    opened: list[str] = []
    real = app_module.open_transport

    def counting(url: str, **options: Any) -> Any:
        opened.append(url)
        return real(url, **options)

    monkeypatch.setattr(app_module, "open_transport", counting)
    override = f"sql+sqlite:///{tmp_path / 'mq2.db'}"
    with SqlTransport(override[len("sql+"):], create_tables=True) as made:
        made.ensure_topic("T")
    # When
    result = CliRunner().invoke(app, ["consume", target, "--transport", override,
                                      "--max-seconds", "1"])
    # Then the override wins, and is opened once (a second one would never be closed)
    assert result.exit_code == 0, result.output
    assert opened == [override]
    sys.modules.pop("urlapp", None)


def test_consume_reads_the_sql_transport_tables_named_by_mq_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an app configured with a URL, the default tables there (empty), and one message on
    # the tables made under the prefix the relay was given
    target = write_app(tmp_path, monkeypatch, "urlapp3", APP_WITH_URL.replace("g_url", "g3"))
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    with SqlTransport(mq, create_tables=True) as default_tables:
        default_tables.ensure_topic("T")
    with SqlTransport(mq, table_prefix="orders_mq", create_tables=True) as prefixed:
        prefixed.send(OutgoingMessage("T", b"{}"))
    # When it runs with that prefix (CKIT_MQ_PREFIX, as exported for the relay)
    result = CliRunner().invoke(app, ["consume", target, "--burst", "--max-seconds", "20"],
                                env={"CKIT_MQ_PREFIX": "orders_mq"})
    # Then it consumed the message there (it polled the empty ckit_mq_* tables before)
    assert result.exit_code == 0, result.output
    assert "succeeded=1" in result.output
    sys.modules.pop("urlapp3", None)


def test_an_mq_prefix_with_a_transport_that_is_not_sql_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an app configured with a URL
    target = write_app(tmp_path, monkeypatch, "urlapp4", APP_WITH_URL.replace("g_url", "g4"))
    # When a prefix is given with a RocketMQ transport
    result = CliRunner().invoke(app, ["consume", target, "--transport",
                                      "rocketmq://127.0.0.1:9876", "--mq-prefix", "orders_mq",
                                      "--max-seconds", "1"])
    # Then nothing starts: one line naming the option
    assert result.exit_code == 2
    assert "--mq-prefix 'orders_mq'" in error_line(result.output)
    sys.modules.pop("urlapp4", None)


def test_an_exported_mq_prefix_leaves_the_apps_own_object_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an app with its own transport object, and CKIT_MQ_PREFIX exported for the relay
    target = write_app(tmp_path, monkeypatch, "objapp5", APP_WITH_OBJECT.replace("g_obj", "g5"))
    # When the app runs
    result = CliRunner().invoke(app, ["consume", target, "--max-seconds", "1"],
                                env={"CKIT_MQ_PREFIX": "orders_mq"})
    # Then it consumes through its own object, and says the variable was not used
    assert result.exit_code == 0, result.output
    assert "CKIT_MQ_PREFIX is set, but app objapp5:app builds its own SqlTransport" \
        in result.output + caplog.text
    sys.modules.pop("objapp5", None)
