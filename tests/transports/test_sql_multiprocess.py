"""Several consumer processes of one group on one SQL broker (SQLite file and MariaDB).

Each process runs `tests/transports/sql_mp_worker.py` and logs its deliveries to a file of its
own; the test sends from this process and reads the files.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer_kit.testing.harness import wait_for
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.sql import SqlTransport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3
DEADLINE = 60.0


@pytest.fixture
def broker(db: tuple[str, str]) -> tuple[str, str]:
    """The `db` fixture's (database URL, table prefix) with the tables created."""
    url, prefix = db
    with SqlTransport(url, table_prefix=prefix, create_tables=True) as transport:
        transport.check_schema()
    return db


class Fleet:
    """The worker processes and their log files."""

    def __init__(self, tmp_path: Path, url: str, prefix: str, group: str, topic: str) -> None:
        self.tmp_path, self.url, self.prefix = tmp_path, url, prefix
        self.group, self.topic = group, topic
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []

    def spawn(self, *extra: str) -> subprocess.Popen[bytes]:
        out = self.tmp_path / f"worker{len(self.procs)}.log"
        with open(self.tmp_path / f"worker{len(self.procs)}.err", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.transports.sql_mp_worker", self.url, self.prefix,
                 self.group, self.topic, str(out), *extra],
                cwd=ROOT, stderr=err,
            )
        self.procs.append(proc)
        self.outs.append(out)
        return proc

    def lines(self) -> list[list[str]]:
        rows = []
        for out in self.outs:
            if out.exists():
                text = out.read_text()
                # only whole lines: a worker may be appending one right now
                rows += [line.split() for line in text[:text.rfind("\n") + 1].splitlines()
                         if line]
        return rows

    def events(self, kind: str) -> list[list[str]]:
        return [row for row in self.lines() if row[0] == kind]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def fleet(broker: tuple[str, str], tmp_path: Path) -> Iterator[Fleet]:
    url, prefix = broker
    suffix = uuid.uuid4().hex[:8]
    f = Fleet(tmp_path, url, prefix, f"g_mp_{suffix}", f"t_mp_{suffix}")
    try:
        yield f
    finally:
        f.stop()


def owners(url: str, prefix: str, group: str) -> collections.Counter[str]:
    """How many queues each member of `group` holds a live lease on."""
    import sqlalchemy as sa

    from consumer_kit.core.clock import utcnow

    with SqlTransport(url, table_prefix=prefix) as transport:
        lease = transport.tables.lease
        rows = transport.db.run(lambda conn: conn.execute(
            sa.select(lease.c.owner).where(lease.c.consumer_group == group,
                                           lease.c.lease_until > utcnow())).scalars().all(),
            write=False, what="read leases")
    return collections.Counter(str(owner) for owner in rows if owner)


def wait_balanced(fleet: Fleet) -> None:
    """Wait until the 4 topic queues + 4 %RETRY% queues are spread 3, 3, 2 over the members."""
    assert wait_for(lambda: sorted(owners(fleet.url, fleet.prefix, fleet.group).values())
                    == [2, 3, 3], DEADLINE, interval=0.2)


def send_all(url: str, prefix: str, topic: str, count: int) -> float:
    """Send `count` messages m0..; return the seconds it took."""
    started = time.monotonic()
    with SqlTransport(url, table_prefix=prefix) as transport:
        for i in range(count):
            transport.send(OutgoingMessage(topic, f"m{i}".encode()))
    return time.monotonic() - started


def test_three_processes_share_the_queues_and_each_message_goes_to_one(fleet: Fleet) -> None:
    # Given three consumer processes of one group, all joined
    for _ in range(PROCESSES):
        fleet.spawn("--lease", "4")
    assert wait_for(lambda: len(fleet.events("ready")) == PROCESSES, DEADLINE)
    wait_balanced(fleet)

    # When
    count = 300
    send_all(fleet.url, fleet.prefix, fleet.topic, count)

    # Then every message is done exactly once, and more than one process did some
    expected = {f"m{i}" for i in range(count)}
    assert wait_for(lambda: {row[2] for row in fleet.events("done")} >= expected, DEADLINE)
    time.sleep(0.5)  # a late duplicate would show up now
    done = fleet.events("done")
    per_body = collections.Counter(row[2] for row in done)
    assert [body for body, n in per_body.items() if n > 1] == []
    per_process = collections.Counter(row[1] for row in done)
    assert len(per_process) == PROCESSES, per_process
    print(f"\nshare: {dict(per_process)}")


def test_a_killed_process_queues_are_taken_over_after_its_lease(fleet: Fleet) -> None:
    # Given three consumer processes; the victim hangs inside its 5th callback
    lease = 2.0
    victim = fleet.spawn("--lease", str(lease), "--hang-after", "5", "--work-ms", "2")
    for _ in range(PROCESSES - 1):
        fleet.spawn("--lease", str(lease), "--work-ms", "2")
    assert wait_for(lambda: len(fleet.events("ready")) == PROCESSES, DEADLINE)
    wait_balanced(fleet)

    count = 200
    send_all(fleet.url, fleet.prefix, fleet.topic, count)
    assert wait_for(lambda: bool(fleet.events("hang")), DEADLINE), "the victim got no messages"
    hung_body = fleet.events("hang")[0][2]

    # When the victim dies mid-message
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at = time.monotonic()

    # Then every message is still done, the hung one by another process
    expected = {f"m{i}" for i in range(count)}
    assert wait_for(lambda: {row[2] for row in fleet.events("done")} >= expected, DEADLINE)
    took = time.monotonic() - killed_at
    done = fleet.events("done")
    assert any(row[2] == hung_body and row[1] != str(victim.pid) for row in done)
    duplicates = sum(n - 1 for n in collections.Counter(row[2] for row in done).values())
    print(f"\nall {count} done {took:.1f}s after the kill (lease {lease}s); "
          f"duplicates: {duplicates}")
    assert took < DEADLINE


SENDER = """
import sys
from consumer_kit.transports import OutgoingMessage
from consumer_kit.transports.sql import SqlTransport
url, prefix, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with SqlTransport(url, table_prefix=prefix) as t:
    for i in range(n):
        t.send(OutgoingMessage(topic, f"{i}".encode()))
"""


def test_sender_processes_at_once_get_gapless_offsets(broker: tuple[str, str]) -> None:
    # Given a topic, When three processes send to it at the same time
    url, prefix = broker
    topic, per = f"t_send_{uuid.uuid4().hex[:8]}", 150
    with SqlTransport(url, table_prefix=prefix) as t:
        t.ensure_topic(topic)
    senders = [subprocess.Popen([sys.executable, "-c", SENDER, url, prefix, topic, str(per)],
                                cwd=ROOT) for _ in range(PROCESSES)]
    assert [p.wait(timeout=DEADLINE) for p in senders] == [0] * PROCESSES

    # Then every queue holds offsets 0..n-1 exactly once
    import sqlalchemy as sa

    with SqlTransport(url, table_prefix=prefix) as t:
        m = t.tables.message
        stored = t.db.run(lambda conn: conn.execute(
            sa.select(m.c.queue_id, m.c.queue_offset).where(m.c.topic == topic)).all(),
            write=False, what="read")
    per_queue: dict[int, list[int]] = collections.defaultdict(list)
    for queue_id, offset in stored:
        per_queue[int(queue_id)].append(int(offset))
    assert len(stored) == PROCESSES * per
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values())
