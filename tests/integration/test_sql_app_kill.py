"""Consumer processes of one group on the SQL transport; one is killed with SIGKILL in the
middle of a handler; after its queues are taken over, every effect is applied exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from consumer_kit.testing.harness import wait_for
from consumer_kit.transports.sql import SqlTransport
from outbox_producer import Outbox, Relay
from tests import services

MESSAGES = 60
PROCESSES = 3
TOPIC = "KILL_TEST"


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb),
                        pytest.param("postgresql", marks=pytest.mark.postgresql)])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'app.db'}", f"sqlite:///{tmp_path / 'mq.db'}"
    elif request.param == "mariadb":
        services.require("mariadb", services.ping_mysql)
        yield services.mysql_url(), services.mysql_url()
    else:
        services.require("postgresql", services.ping_postgres)
        yield services.pg_url(), services.pg_url()


def stop_inside_handler(victim: subprocess.Popen[bytes], marker: Path, seconds: float) -> int:
    """Freeze the victim (SIGSTOP) at a moment its handler is running; return the message's n.

    The marker lives only while a handler runs, so seeing it and then killing could land
    after that handler returned (and its transaction committed): the victim is frozen first,
    and let go again if the marker went away meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not marker.exists():
            time.sleep(0.01)
            continue
        victim.send_signal(signal.SIGSTOP)
        try:
            assert wait_for(lambda: stopped(victim.pid), 10, interval=0.01), "not stopped"
            if marker.exists():
                return int(marker.read_text())
        except BaseException:
            victim.send_signal(signal.SIGCONT)  # the clean-up's SIGTERM must reach it
            raise
        victim.send_signal(signal.SIGCONT)
    raise AssertionError("the victim never started a handler")


def stopped(pid: int) -> bool:
    """Whether the process is in the stopped state (T in /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_consumer_killed_mid_handler_loses_nothing_and_applies_nothing_twice(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    # Given: the producer's outbox, the consumer's tables, the SQL broker, three consumers
    db_url, mq_url = urls
    tag = uuid.uuid4().hex[:8]
    names = TableNames(outbox=f"k{tag}_outbox", receipts=f"k{tag}_ack",
                       processed=f"k{tag}_processed")
    engine = make_engine(db_url)
    metadata = build_metadata(names, include_transport=False)
    effects = sa.Table(f"k{tag}_effects", metadata,
                       sa.Column("id", sa.Integer, primary_key=True),
                       sa.Column("n", sa.Integer, nullable=False),
                       sa.Column("pid", sa.Integer, nullable=False))
    metadata.create_all(engine)
    prefix = f"k{tag}_mq"
    transport = SqlTransport(mq_url, table_prefix=prefix, create_tables=True)
    transport.ensure_topic(TOPIC)
    env = {**os.environ, "W_DB": db_url, "W_MQ": mq_url, "W_PREFIX": prefix, "W_LEASE": "2",
           "W_GROUP": f"kill-{tag}", "W_PROCESSED": names.processed, "W_EFFECTS": effects.name,
           "W_TOPIC": TOPIC, "W_BUSY_DIR": str(tmp_path), "W_HANDLER_SECONDS": "0.05",
           "W_MAX_SECONDS": "200", "PYTHONPATH": str(Path(__file__).parent.parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.app_worker"], env=env)
             for _ in range(PROCESSES)]
    try:
        outbox = Outbox(engine, producer="orders", table=names.outbox)
        with engine.begin() as conn:
            for n in range(MESSAGES):
                outbox.publish(conn, TOPIC, {"n": n}, biz_type="k", biz_key=str(n))
        assert Relay(engine, transport, table=names.outbox).run_once().stats.sent == MESSAGES

        # When: one process is killed while it is inside a handler
        victim = procs[0]
        in_flight = stop_inside_handler(victim, tmp_path / f"busy-{victim.pid}", 60)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)

        # Then: the survivors take its queues over and every message is applied exactly once
        processed = metadata.tables[names.processed]

        def all_processed() -> bool:
            with engine.connect() as conn:
                return (conn.execute(sa.select(sa.func.count()).select_from(processed))
                        .scalar() or 0) >= MESSAGES

        assert wait_for(all_processed, 120, interval=0.05), "messages were lost after the kill"
        time.sleep(1.0)  # let any straggling duplicate delivery finish
        with engine.connect() as conn:
            rows = conn.execute(sa.select(effects.c.n, sa.func.count()).group_by(effects.c.n)
                                ).all()
        assert {n: c for n, c in rows} == {n: 1 for n in range(MESSAGES)}
        with engine.connect() as conn:
            applied_by = conn.execute(sa.select(effects.c.pid).where(effects.c.n == in_flight)
                                      ).scalar()
        assert applied_by != victim.pid  # the killed handler's write rolled back; redelivered
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(30)
        transport.close()
        if not db_url.startswith("sqlite"):
            metadata.drop_all(engine)
            with engine.begin() as conn:
                for name in sa.inspect(engine).get_table_names():
                    if name.startswith(prefix):
                        conn.execute(sa.text(f"DROP TABLE {name}"))
        engine.dispose()
