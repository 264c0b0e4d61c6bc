"""`ckit reconcile` checks every option before it reads or repairs anything, and keeps Spark's
own noise out of its output unless -v (issue 11, class 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.states import OutboxState
from spark.session import QUIET_LOG4J2, quiet_java_options
from tests.cli import error_line
from tests.reconcile.conftest import World

ROOT = Path(__file__).resolve().parents[2]
#: What Spark prints on every start with its default log configuration.
SPARK_NOISE = ("WARN Utils: Your hostname", "SPARK_LOCAL_IP", "NativeCodeLoader",
               "Setting default log level", "To adjust logging level")


def args(w: World, *extra: str) -> list[str]:
    return ["reconcile", "--url", w.producer_url,
            "--group", f"inventory={w.group_urls['inventory']}",
            "--processed-table", w.processed["inventory"].name,
            "--outbox-table", w.outbox.name, "--receipt-table", w.receipts.name, *extra]


@pytest.mark.parametrize("kind", ["sqlite"])
@pytest.mark.parametrize(("bad", "option"), [
    (["--fail-on-stuck", "-1"], "--fail-on-stuck"),
    (["--fail-on-orphans", "-1"], "--fail-on-orphans"),
    (["--fail-on-conflicts", "-1"], "--fail-on-conflicts"),
    (["--batch-size", "0"], "--batch-size"),
    (["--max-retries", "-1"], "--max-retries"),
    (["--output", "{file}/out"], "--output"),
    (["--conf", "spark.ui.enabled"], "--conf"),
    (["--engine", "hive"], "--engine"),
    (["--stuck-after", "inf"], "--stuck-after"),
    (["--orphan-window", "nan"], "--orphan-window"),
    (["--engine", "spark", "--master", "bogus"], "--master"),
    (["--group", "billing=sqlite:///{file}/billing.db"], "--group billing"),
])
def test_a_bad_option_is_one_line_naming_it_and_repairs_nothing(
        world: World, tmp_path: Path, bad: list[str], option: str) -> None:
    # Given a row the reconciler would repair (its receipt was lost)
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    (tmp_path / "file").write_text("")
    # When
    result = CliRunner().invoke(app, args(world, "--engine", "sql", "-o", "",
                                          *[b.format(file=tmp_path / "file") for b in bad]))
    # Then
    assert result.exit_code == 2, result.output
    line = error_line(result.output)
    assert option in line and "at org." not in line
    assert world.row(lost).state == int(OutboxState.SENT)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["sqlite"])
def test_spark_keeps_its_own_warnings_and_banner_out_of_the_output(world: World,
                                                                   tmp_path: Path) -> None:
    # Given a row to repair
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    # When the Spark engine runs in a fresh JVM, without -v
    result = subprocess.run(
        [sys.executable, "-m", "consumer_kit.cli.main", *args(
            world, "--engine", "spark", "--master", "local[1]", "-o", "")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Then it repaired the row and printed none of Spark's start-up noise
    assert result.returncode == 0, result.stderr
    assert world.row(lost).state == int(OutboxState.CONSUMED)
    noise = [n for n in SPARK_NOISE if n in result.stdout + result.stderr]
    assert not noise, result.stderr


def test_spark_runs_with_the_quiet_log_configuration_unless_verbose() -> None:
    assert QUIET_LOG4J2.is_file()
    quiet = quiet_java_options("-Duser.timezone=UTC", verbose=False)
    assert quiet == f"-Duser.timezone=UTC -Dlog4j2.configurationFile={QUIET_LOG4J2}"
    assert quiet_java_options("-Duser.timezone=UTC", verbose=True) == "-Duser.timezone=UTC"
    mine = "-Dlog4j2.configurationFile=/etc/mine.properties"
    assert quiet_java_options(mine, verbose=False) == mine  # a user's own file wins
