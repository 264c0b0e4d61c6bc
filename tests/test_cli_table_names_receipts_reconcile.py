"""`ckit receipts` and `ckit reconcile` given two table options naming one table: one line naming
both, as `ckit db` and `ckit outbox` say (`tests/test_cli_db_outbox.py`). They said "database
error: InvalidRequestError: Table 'orders' is already defined for this MetaData instance.
Specify 'extend_existing=True' ...", naming neither option."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from consumer_kit.cli.main import app
from consumer_kit.core.errors import ConfigError
from outbox_producer import ReceiptApplier


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CKIT_DB_URL", "CKIT_TRANSPORT", "CKIT_OUTBOX_TABLE", "CKIT_RECEIPT_TABLE",
                 "CKIT_PROCESSED_TABLE", "CKIT_MQ_PREFIX", "CKIT_PRODUCER"):
        monkeypatch.delenv(name, raising=False)


def ckit(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def assert_one_error_line(result: Result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and text in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "MetaData" not in result.output and "Traceback" not in result.output


@pytest.fixture()
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    assert ckit("db", "init", "--url", url).exit_code == 0
    return url


@pytest.mark.parametrize(("options", "said"), [
    (["--outbox-table", "orders", "--receipt-table", "orders"],
     "the outbox table and the receipt table are both named 'orders'"),
    (["--outbox-table", "ckit_outbox_receipt"],
     "the outbox table and the receipt table are both named 'ckit_outbox_receipt'"),
    (["--receipt-table", "ckit_outbox_archive"],
     "the outbox archive table and the receipt table are both named 'ckit_outbox_archive'"),
], ids=["both", "outbox-as-receipts-default", "receipts-as-archive"])
def test_receipts_given_two_table_options_naming_one_table_is_one_line_naming_both(
        url: str, options: list[str], said: str) -> None:
    result = ckit("receipts", "--url", url, "--transport", f"sql+{url}", "--producer", "orders",
                  "--burst", *options)
    assert_one_error_line(result, said)


@pytest.mark.parametrize(("options", "said"), [
    (["--outbox-table", "orders", "--receipt-table", "ORDERS"],
     "the outbox table and the receipt table are named 'orders' and 'ORDERS'"),
    (["--receipt-table", "ckit_outbox_archive"],
     "the outbox archive table and the receipt table are both named 'ckit_outbox_archive'"),
], ids=["both", "receipts-as-archive"])
def test_reconcile_given_two_table_options_naming_one_table_is_one_line_naming_both(
        url: str, options: list[str], said: str) -> None:
    result = ckit("reconcile", "--url", url, "--group", f"inventory={url}", "--engine", "sql",
                  "--output", "", "--quiet", *options)
    assert_one_error_line(result, said)


def test_a_receipt_applier_on_one_table_twice_is_refused_naming_both() -> None:
    engine = sa.create_engine("sqlite://")
    with pytest.raises(ConfigError, match="outbox table and the receipt table are both named"):
        ReceiptApplier(engine, table="orders", receipt_table_name="orders")
