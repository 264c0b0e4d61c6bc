"""`ckit reconcile` from the command line, and the Spark engine's less common read paths."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.states import OutboxState
from consumer_kit.reconcile import (
    EXIT_ALERT,
    EXIT_OK,
    GroupSource,
    ReconcileError,
    RepairClass,
    run_reconcile,
)
from tests.cli import error_line
from tests.reconcile.conftest import World

REPO = Path(__file__).resolve().parents[2]


def _args(w: World, *extra: str) -> list[str]:
    return ["reconcile", "--url", w.producer_url,
            "--group", f"inventory={w.group_urls['inventory']}",
            "--processed-table", w.processed["inventory"].name,
            "--outbox-table", w.outbox.name, "--receipt-table", w.receipts.name, *extra]


@pytest.mark.parametrize("kind", ["sqlite",
                                  pytest.param("postgresql", marks=pytest.mark.postgresql)])
def test_cli_prints_a_summary_writes_the_output_folder_and_exits_for_cron(
        world: World, tmp_path: Path) -> None:
    # Given an ack-lost row and a rejected one
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    rejected = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", rejected, "FAILED", error="bad json")
    out = tmp_path / "out"

    # When `ckit reconcile --engine sql` runs
    result = CliRunner().invoke(app, _args(world, "--engine", "sql", "--output", str(out)))

    # Then it prints the table, alerts on the rejected row, and writes summary + samples
    assert result.exit_code == EXIT_ALERT, result.output
    assert "receipt_lost" in result.stdout
    assert "ALERT: 1 rows of failure class rejected" in result.output
    assert "[reconcile" in result.output  # progress lines
    latest = json.loads((out / "latest.json").read_text())
    assert latest["classes"]["receipt_lost"]["applied"] == 1
    samples = Path(latest["output_dir"]) / "samples" / "rejected.jsonl"
    assert json.loads(samples.read_text().splitlines()[0])["message_id"] == rejected

    # And a second run finds nothing, exits 0, and --json is machine readable
    again = CliRunner().invoke(app, _args(world, "--engine", "sql", "--output", "", "--json",
                                          "--quiet"))
    assert again.exit_code == EXIT_OK, again.output
    assert json.loads(again.stdout)["window_rows"] == 0


@pytest.mark.parametrize("bad", ["a typo in its path", "no tables"])
@pytest.mark.parametrize("kind", ["sqlite",
                                  pytest.param("mariadb", marks=pytest.mark.mariadb)])
def test_a_sharded_run_with_one_bad_shard_repairs_no_shard_and_names_it(
        world: World, tmp_path: Path, bad: str) -> None:
    # Given rows to repair in the first shard (an ack-lost row, a lost message)
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    world.add_outbox(OutboxState.SENT)
    before = world.snapshot()
    # and a second --url that cannot be reconciled
    shard = tmp_path / "shard-b.db"
    if bad == "no tables":
        sqlite3.connect(shard).close()
    # When the run is asked for both shards
    result = CliRunner().invoke(app, _args(world, "--url", f"sqlite:///{shard}", "--engine",
                                           "sql", "--output", "", "--quiet"))
    # Then it stops with one line naming the shard before anything is read or repaired
    assert result.exit_code == 2, result.output
    assert "shard-b.db" in error_line(result.output)
    assert world.snapshot() == before
    assert shard.exists() is (bad == "no tables")  # no empty database made for a typo


def test_cli_never_prints_a_password() -> None:
    # Given a producer URL with a password whose server refuses connections
    url = "mysql+pymysql://app:s3cret@127.0.0.1:1/orders"
    # When the reconcile fails to connect
    result = CliRunner().invoke(app, ["reconcile", "--url", url, "--engine", "sql", "--output",
                                      "", "--group", f"g={url}"])
    # Then the error names the failure without the password
    assert result.exit_code != 0
    assert "s3cret" not in result.output and "error:" in result.output


@pytest.mark.spark
def test_spark_large_window_range_read_matches_the_in_list_read(
        world: World, spark: object) -> None:
    # Given stuck rows of three classes
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)
    rejected = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", rejected, "FAILED", error="nope")
    retry = world.add_outbox(OutboxState.SENT)

    # When the window counts as large (processed rows read by processed_at range, not IN lists)
    summary = run_reconcile(world.config("spark", in_list_max=0))

    # Then the outcome is the same as with IN lists
    assert summary.details["evidence_read"] == "range"
    assert world.row(lost).state == OutboxState.CONSUMED
    assert world.row(rejected).state == OutboxState.REJECTED
    assert world.row(retry).state == OutboxState.PENDING


@pytest.mark.spark
def test_spark_range_read_finds_the_evidence_of_a_first_delivery_hours_before_a_re_send(
        world: World, spark: object) -> None:
    # Given rows created and first delivered 3 h ago, re-sent since (their sent_at is recent):
    # one processed then (its receipt lost), one its group refused then
    three_hours = dt.timedelta(hours=3)
    lost = world.add_outbox(OutboxState.SENT, retry_count=3, max_retries=3)
    world.add_processed("inventory", lost, age=three_hours)
    refused = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", refused, "FAILED", error="nope", age=three_hours)
    with world.producer.begin() as conn:
        conn.execute(world.outbox.update().values(gmt_create=world.now - three_hours))

    # When the window counts as large (evidence read by time range, not IN lists)
    summary = run_reconcile(world.config("spark", in_list_max=0))

    # Then the old evidence is found: as the IN-list read and the SQL engine decide
    assert summary.details["evidence_read"] == "range"
    assert world.row(lost).state == OutboxState.CONSUMED
    assert world.row(refused).state == OutboxState.REJECTED


@pytest.mark.spark
def test_spark_range_read_finds_what_a_consumer_with_a_clock_hours_behind_recorded(
        world: World, spark: object) -> None:
    # Given rows processed by a consumer whose clock is 3 h behind the producer's (their
    # processed_at before the rows were even made): one at its retry limit, one refused
    behind = dt.timedelta(hours=3)
    lost = world.add_outbox(OutboxState.SENT, retry_count=3, max_retries=3)
    world.add_processed("inventory", lost, age=behind)
    refused = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", refused, "FAILED", error="nope", age=behind)
    nobody = world.add_outbox(OutboxState.SENT)

    # When the window counts as large (evidence read by time range, not IN lists)
    summary = run_reconcile(world.config("spark", in_list_max=0))

    # Then the rows the range found no word for are read again by id: as the SQL engine decides
    assert summary.details["evidence_read"] == "range"
    assert summary.details["read_again_by_id"] == 3
    assert world.row(lost).state == OutboxState.CONSUMED
    assert world.row(refused).state == OutboxState.REJECTED
    assert world.row(nobody).state == OutboxState.PENDING


@pytest.mark.spark
def test_spark_message_ids_with_quotes_go_through_bound_parameters(
        world: World, spark: object) -> None:
    # Given a message id no SQL literal may carry
    odd = world.add_outbox(OutboxState.SENT, message_id="it's'); DROP TABLE x; -- \\ end")
    world.add_processed("inventory", odd)

    # When the Spark engine reconciles / Then it is matched (via the driver) and repaired
    summary = run_reconcile(world.config("spark", orphan_window=dt.timedelta(0)))
    assert summary.classes[RepairClass.RECEIPT_LOST].applied == 1
    assert world.row(odd).state == OutboxState.CONSUMED


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["sqlite"])
def test_spark_submit_runs_the_job_file(world: World, tmp_path: Path) -> None:
    # Given a stuck row, and spark-submit from pyspark
    pyspark = pytest.importorskip("pyspark")
    from spark.jdbc import find_jars

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    lost = world.add_outbox(OutboxState.SENT)
    world.add_processed("inventory", lost)

    # When the job file is submitted directly
    cmd = [str(submit), "--master", "local[1]", "--jars", ",".join(find_jars({"sqlite"})),
           "--conf", "spark.ui.enabled=false", str(REPO / "spark" / "reconcile_job.py"),
           *_args(world, "--output", str(tmp_path / "out"), "--json", "--quiet")[1:]]
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PATH": "/usr/bin:/bin", "JAVA_HOME": _java_home(), "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False, env=env)

    # Then it repairs the row and prints the JSON summary
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert json.loads(done.stdout)["classes"]["receipt_lost"]["applied"] == 1
    assert world.row(lost).state == OutboxState.CONSUMED

    # And without --jars it stops at once, saying which flag to add
    no_jars = [c for c in cmd if c not in ("--jars", ",".join(find_jars({"sqlite"})))]
    done = subprocess.run(no_jars, capture_output=True, text=True, timeout=240, check=False,
                          env=env)
    assert done.returncode == 2
    # (spark-submit merges the Python process's stderr into its stdout)
    assert '--jars "$(scripts/jdbc.sh jars)"' in done.stdout


def _java_home() -> str:
    import os

    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = Path(subprocess.run(["readlink", "-f", "/usr/bin/java"], capture_output=True,
                               text=True, check=True).stdout.strip())
    return str(java.parent.parent)


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["sqlite"])
def test_spark_job_failure_is_one_line_not_a_java_stack_trace(world: World, spark: object) -> None:
    # Given a stuck row and a group whose processed table does not exist
    world.add_outbox(OutboxState.SENT)
    config = world.config("spark")
    broken = dataclasses.replace(config, groups=(GroupSource(
        "inventory", world.group_urls["inventory"], table="no_such_table"),))

    # When the Spark engine runs / Then it raises the library's error with the JDBC message
    with pytest.raises(ReconcileError, match="no such table") as info:
        run_reconcile(broken)
    assert "\n" not in str(info.value) and "at org." not in str(info.value)


@pytest.mark.parametrize("argv", [["--bogus"], ["--batch-size", "x"]])
def test_spark_submit_entry_exits_2_on_a_bad_option_without_a_traceback(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from consumer_kit.cli.reconcile import standalone

    # When the spark-submit entry gets an unknown option or a value of the wrong type
    code = standalone(argv)

    # Then it exits 2 (bad options, as documented) with click's one-line error
    assert code == 2
    err = capsys.readouterr().err
    assert "Error" in err and "Traceback" not in err
