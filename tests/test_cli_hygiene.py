"""CLI hygiene: one line per error naming the option, quiet pipes, a demo that checks its options
first, cleans up after itself and counts redeliveries right (issue 11, class 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit import ConsumerApp, Message, Retry
from consumer_kit.cli.main import app
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.schema import processed_table
from consumer_kit.outcome import Outcome
from consumer_kit.transports.sql import SqlTransport
from tests import services
from tests.cli import ROOT, ckit, error_line


@pytest.mark.parametrize(("args", "option"), [
    (["relay", "--bogus"], "--bogus"),
    (["relay", "--batch", "0"], "--batch"),
    (["relay", "--metrics-port", "99999"], "--metrics-port"),
    (["processed", "purge", "--url", "sqlite://"], "--group"),
    (["outbox", "retry", "--state", "FAILED", "--limit", "0"], "--limit"),
    (["outbox", "archive", "--batch", "0"], "--batch"),
    (["mq", "purge", "--batch", "0"], "--batch"),
    (["demo", "--orders", "1"], "--orders"),
])
def test_a_usage_error_is_one_line_naming_the_option_not_a_box(args: list[str],
                                                               option: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert option in error_line(result.output)


@pytest.mark.parametrize("producer", ["", "bad name!"])
def test_receipts_refuses_a_producer_that_cannot_name_its_topic_before_touching_anything(
        tmp_path: Path, producer: str) -> None:
    # it used to exit 0, having made topic `ckit-receipt-` and its group in the broker
    mq = tmp_path / "mq.db"
    result = CliRunner().invoke(app, ["receipts", "--url", f"sqlite:///{tmp_path / 'p.db'}",
                                      "--transport", f"sql+sqlite:///{mq}", "--producer",
                                      producer, "--burst"])
    assert result.exit_code == 2
    assert "producer" in error_line(result.output)
    assert not mq.exists() and not (tmp_path / "p.db").exists()


def test_ckit_alone_still_prints_its_help() -> None:
    result = CliRunner().invoke(app, [])
    assert "Usage" in result.output and "relay" in result.output


def test_output_piped_into_head_ends_without_a_broken_pipe() -> None:
    # When the reader stops after one line (and when it is gone before the first write)
    piped = subprocess.run(f"{sys.executable} -m consumer_kit.cli.main db ddl | head -1",
                           shell=True, capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        closed = subprocess.run([sys.executable, "-m", "consumer_kit.cli.main", "db", "ddl"],
                                stdout=write_end, stderr=subprocess.PIPE, text=True,
                                timeout=120, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write_end)
    # Then nothing but the line read, and no traceback
    assert piped.stdout.startswith("-- consumer-kit schema") and piped.stderr == ""
    assert closed.returncode == 1 and closed.stderr == ""


# -- ckit demo -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "option"), [
    (["--engine", "bogus"], "--engine"),
    (["--dir", "{file}/sub"], "--dir"),
    (["--redis", "redis://127.0.0.1:1/0"], "--redis"),
    (["--redis", "http://127.0.0.1/0"], "--redis"),
    # `--redis "$REDIS_URL"` with the variable unset: the check was skipped, the relay step
    # ran, and the consumer step failed on redis-py's own line, naming no option
    (["--redis", ""], "--redis"),
])
def test_the_demo_checks_every_option_before_its_first_step_and_leaves_no_folder(
        tmp_path: Path, args: list[str], option: str) -> None:
    # Given a temporary folder of its own, and a file where a folder is expected
    (tmp_path / "file").write_text("")
    temp = tmp_path / "temp"
    temp.mkdir()
    # When
    result = ckit("demo", *[a.format(file=tmp_path / "file") for a in args],
                  env={"TMPDIR": str(temp)})
    # Then one line, exit 2, no step ran and no folder is left
    assert result.returncode == 2
    assert option in error_line(result.stderr)
    assert "->" not in result.stdout
    assert list(temp.iterdir()) == []


def test_a_demo_step_that_fails_leaves_no_temporary_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from consumer_kit.cli import demo_flow
    from outbox_producer import Relay

    # Given a relay that breaks mid-demo
    def broken(self: Relay) -> None:
        raise RuntimeError("relay broke")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(Relay, "run_once", broken)
    # When / Then
    with pytest.raises(RuntimeError, match="relay broke"):
        demo_flow.run_demo(orders=3, engine="sql", say=lambda _m: None)
    assert list(tmp_path.iterdir()) == []


def test_a_burst_run_waits_for_a_redelivery_still_scheduled_when_the_queues_run_dry(
        tmp_path: Path) -> None:
    from consumer_kit.cli.demo_flow import GROUP

    # Given a handler that asks for a redelivery the first time (RECONSUME_LATER, as a
    # duplicate that finds the first copy's Redis lease does), with a 1 s back-off
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    processed_table(sa.MetaData()).create(sa.create_engine(db))
    transport = SqlTransport(f"sqlite:///{tmp_path / 'mq.db'}", create_tables=True,
                             retry_delays=(1.0,))
    calls: list[str] = []
    consumer = ConsumerApp(group=GROUP, db=db, transport=transport, receipts=None)

    @consumer.listener("ORDER_CREATED")
    def handle(msg: Message) -> None:
        calls.append(msg.id)
        if len(calls) == 1:
            raise Retry("lease held")

    transport.send(OutgoingMessage("ORDER_CREATED", b"{}", keys=("m1",)))
    try:
        # When
        consumer.run(burst=True, max_seconds=60)
    finally:
        consumer.close()
        transport.close()
    # Then the redelivery was handled before it returned (a burst alone stops before it)
    assert calls == ["m1", "m1"]
    counts = consumer.pipeline().counts
    assert (counts[Outcome.RETRY], counts[Outcome.SUCCEEDED]) == (1, 1)


@pytest.mark.redis
def test_the_demo_with_redis_passes_its_own_check(tmp_path: Path) -> None:
    services.require("redis", services.ping_redis)
    result = ckit("demo", "--engine", "sql", "--dir", str(tmp_path), "--redis",
                  services.redis_url(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exactly once in effect" in result.stdout
