"""The fault runner's `--db postgresql`: the same seeded plan with postgres-kill in mariadb-kill's
place, and the run's own PostgreSQL (Debian's initdb + postgres on a port of its own, never the
shared server) back after a kill -9 with the rows it had, its doubled-effect sample read with
PostgreSQL's own aggregate, and nothing of it left running after `stop`.

Needs Debian's PostgreSQL server binaries (scripts/postgres.sh install); skipped without them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.faults import checks, kit, schedule, world
from bench.faults.postgres import PostgreSQL, missing_programs


def test_a_postgresql_run_plans_postgres_kill_where_a_mariadb_run_plans_mariadb_kill() -> None:
    # Given the kinds of both databases on each transport
    for transport in ("sql", "rocketmq", "rocketmq5"):
        mariadb = schedule.kinds_for(transport)
        postgresql = schedule.kinds_for(transport, "postgresql")
        # Then only the database kill differs
        assert [k for k in mariadb if k not in postgresql] == ["mariadb-kill"]
        assert [k for k in postgresql if k not in mariadb] == ["postgres-kill"]
        # And a seed plans the same times, targets and down times on both
        a = schedule.plan(mariadb, repeats=2, start=10, end=90, seed=7)
        b = schedule.plan(postgresql, repeats=2, start=10, end=90, seed=7)
        assert [(f.at, f.target, f.down, f.kind.replace("mariadb", "postgres")) for f in a] \
            == [(f.at, f.target, f.down, f.kind) for f in b]


def test_the_urls_of_a_postgresql_run_use_psycopg_and_its_connect_options() -> None:
    urls = world.Urls(15432, "redis://x", "t", "postgresql")
    assert urls.orders == "postgresql+psycopg://ckit:ckit@127.0.0.1:15432/faults_orders"
    assert world.transport_url("sql", db_port=15432, namesrv_port=1, db_kind="postgresql") \
        == "sql+postgresql+psycopg://ckit:ckit@127.0.0.1:15432/faults_mq"
    assert world.connect_args(urls.orders) == {"connect_timeout": 3}
    # And a MariaDB run's are as they were
    assert world.Urls(13306, "", "").orders.startswith("mysql+pymysql://")
    assert "read_timeout" in world.connect_args(world.Urls(13306, "", "").orders)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[PostgreSQL]:
    if missing_programs():
        pytest.skip("no PostgreSQL server binaries: run scripts/postgres.sh install")
    # the postgres user (the server's, when the tests run as root) must reach the folder
    folder = Path(tempfile.mkdtemp(prefix="ckit-faults-pg-", dir="/tmp"))
    folder.chmod(0o755)
    pg = PostgreSQL(folder / "postgresql", free_port())
    try:
        pg.install()
        pg.start()
        pg.provision(world.DATABASES, world.DB_USER, world.DB_PASSWORD)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_runs_postgresql_comes_back_after_kill_9_and_leaves_nothing_running(
    server: PostgreSQL,
) -> None:
    # Given the run's tables, an order applied twice, and a client connected (a backend)
    urls = world.Urls(server.port, "", "", "postgresql")
    for url in (urls.orders, urls.inventory):
        subprocess.run([*kit.CLI, "db", "init", "--url", url], check=True, capture_output=True,
                       env=world.child_env({}))
    orders, inventory = world.engine(urls.orders), world.engine(urls.inventory)
    try:
        world.orders.create(orders)
        world.effects.create(inventory)
        with inventory.begin() as conn:
            for pid in (11, 12):
                conn.execute(world.effects.insert().values(order_id=1, message_id="m", pid=pid,
                                                           at=0.0))
        held = inventory.connect()
        held.execute(sa.text("SELECT 1"))

        # When the postmaster is killed -9 and started again
        killed = server.kill9()
        server.start()

        # Then it is a new postmaster with the rows committed before
        assert server.pid is not None and server.pid != killed
        snap = checks.snapshot(orders, inventory)
        assert snap.doubled == 1
        assert snap.doubled_sample == [{"order_id": 1, "effects": 2, "pids": "11,12"}] or \
            snap.doubled_sample == [{"order_id": 1, "effects": 2, "pids": "12,11"}]
        held.invalidate()
        held.close()
    finally:
        orders.dispose()
        inventory.dispose()

    # And after stop no process works in its data directory
    datadir = server.datadir
    server.stop()
    assert server.leftovers() == []
    assert not any(_cwd(pid) == datadir.resolve() for pid in _pids())


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
