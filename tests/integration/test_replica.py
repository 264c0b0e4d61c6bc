"""Scan the replica, write the primary: `ckit relay --read-url` on a real MariaDB replica
(scripts/mariadb-replica.sh), in sync, lagging and unreachable. `ckit reconcile --read-url`
with the replica stopped: tests/reconcile/test_scale_out.py.

The replica is read only for user ckit, so any write that reached it would fail these tests.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import Result
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox, Relay
from outbox_producer.replica import ReplicaClaimer
from tests.cli import error_line
from tests.integration.replica import ReplicaPair, replica_pair
from tests.recording import RecordingTransport

pytestmark = pytest.mark.mariadb

DEADLINE_S = 30.0


@pytest.fixture
def pair() -> Iterator[ReplicaPair]:
    yield from replica_pair()


def publish(pair: ReplicaPair, keys: range) -> list[str]:
    outbox = Outbox(pair.primary, producer="orders", table=pair.names.outbox)
    with pair.primary.begin() as conn:
        return [outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=str(k)) for k in keys]


def states(pair: ReplicaPair, engine: sa.Engine | None = None) -> dict[str, OutboxState]:
    t = outbox_table(sa.MetaData(), pair.names.outbox)
    with (engine or pair.primary).connect() as conn:
        return {m: OutboxState(s) for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}


def relay(pair: ReplicaPair, transport: RecordingTransport, **options: object) -> Relay:
    return Relay(pair.primary, transport, table=pair.names.outbox, read_engine=pair.replica,
                 **options)  # type: ignore[arg-type]


def scans(r: Relay) -> ReplicaClaimer:
    assert isinstance(r.claimer, ReplicaClaimer)
    return r.claimer


def test_a_relay_scanning_the_replica_sends_every_row_once_claiming_on_the_primary(
        pair: ReplicaPair) -> None:
    # Given 50 rows committed on the primary and applied on the replica
    ids = publish(pair, range(50))
    pair.caught_up()
    transport = RecordingTransport()
    # When a relay scans the replica for them
    worker = relay(pair, transport, batch=20)
    result = worker.run_once()
    # Then each went out once, claimed and marked on the primary (the replica is read only)
    assert result.stats.sent == 50 and transport.counts() == {m: 1 for m in ids}
    assert set(states(pair).values()) == {OutboxState.SENT}
    # and the candidates came from the replica, not from primary sweeps (--once ends with one,
    # which found nothing left)
    stats = scans(worker).stats
    assert stats.replica_scans >= 3 and stats.claimed == 50 and stats.sweeps == 1


def test_a_lagging_replica_delays_rows_but_never_sends_one_twice(pair: ReplicaPair) -> None:
    # Given 30 rows the replica shows PENDING, then replication lagging (SQL thread stopped)
    first = publish(pair, range(30))
    pair.caught_up()
    transport = RecordingTransport()
    with pair.lagging("SQL_THREAD"):
        # while a relay on the primary alone sends them all, and 10 more rows are committed
        assert Relay(pair.primary, transport, table=pair.names.outbox).run_once().stats.sent == 30
        later = publish(pair, range(30, 40))
        assert all(s is OutboxState.PENDING for s in states(pair, pair.replica).values())
        # When a relay scanning the stale replica runs --once (no primary sweep due)
        worker = relay(pair, transport, sweep_every=3600)
        result = worker.run_once()
        # Then its 30 stale candidates are re-checked on the primary and none is sent again,
        # and the 10 rows the replica does not show are found by the sweep --once ends with
        stats = scans(worker).stats
        assert (stats.claimed, stats.sweeps) == (0, 1) and stats.stale >= 30
        assert result.stats.sent == 10
        assert transport.counts() == {m: 1 for m in first + later}
        # When 10 more rows are committed and a running relay's primary sweep comes due
        later += publish(pair, range(40, 50))
        sweeping = relay(pair, transport, sweep_every=0.2, idle_sleep=0.05)
        thread = threading.Thread(target=sweeping.run)
        thread.start()
        try:
            deadline = time.monotonic() + DEADLINE_S
            while (time.monotonic() < deadline
                   and any(states(pair)[m] is not OutboxState.SENT for m in later)):
                time.sleep(0.05)
        finally:
            sweeping.stop()
            thread.join(DEADLINE_S)
        # Then the rows the lagging replica hid went out, found by the sweep
        assert all(states(pair)[m] is OutboxState.SENT for m in later)
        assert scans(sweeping).stats.sweeps >= 1
    # and once the replica caught up, a scan finds nothing: every message went out exactly once
    pair.caught_up()
    assert relay(pair, transport).run_once().stats.sent == 0
    assert transport.counts() == {m: 1 for m in first + later}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_relay_whose_replica_is_unreachable_scans_the_primary_instead(
        pair: ReplicaPair) -> None:
    # Given rows on the primary and a read replica URL where nothing listens
    ids = publish(pair, range(20))
    down = sa.engine.make_url(pair.replica_url).set(port=closed_port())
    transport = RecordingTransport()
    # When the relay runs
    worker = Relay(pair.primary, transport, table=pair.names.outbox,
                   read_engine=down.render_as_string(hide_password=False))
    result = worker.run_once()
    # Then every row went out once, through the primary
    assert result.stats.sent == 20 and transport.counts() == {m: 1 for m in ids}
    assert scans(worker).stats.fallbacks >= 1 and scans(worker).stats.replica_scans == 0


def relay_command(pair: ReplicaPair, read_url: str, tmp_path: Path) -> Result:
    """`ckit relay --once` on the primary with `read_url`, to a SQL transport in `tmp_path`."""
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", mq]).exit_code == 0
    return CliRunner().invoke(app, [
        "relay", "--url", pair.primary_url, "--read-url", read_url, "--outbox-table",
        pair.names.outbox, "--transport", f"sql+{mq}", "--once"])


def test_ckit_relay_starts_while_its_replica_is_down_and_scans_the_primary(
        pair: ReplicaPair, tmp_path: Path) -> None:
    ids = publish(pair, range(5))
    down = sa.engine.make_url(pair.replica_url).set(port=closed_port())
    result = relay_command(pair, down.render_as_string(hide_password=False), tmp_path)
    assert result.exit_code == 0, result.output
    assert "--read-url number 1 does not answer" in result.output
    assert set(states(pair).values()) == {OutboxState.SENT} and len(ids) == 5


def test_ckit_relay_refuses_a_replica_that_refuses_its_login_before_any_row_moves(
        pair: ReplicaPair, tmp_path: Path) -> None:
    # Given due rows, and a replica URL whose password is wrong (a misconfiguration: waiting
    # cannot fix it, as it would fix a replica that is down)
    publish(pair, range(5))
    wrong = sa.engine.make_url(pair.replica_url).set(password="not-the-password")
    # When `ckit relay --once` starts
    result = relay_command(pair, wrong.render_as_string(hide_password=False), tmp_path)
    # Then it stops with one line naming the refusal, exit 2, and nothing was sent
    assert result.exit_code == 2, result.output
    line = error_line(result.output)
    assert "Access denied" in line and "not-the-password" not in result.output
    assert set(states(pair).values()) == {OutboxState.PENDING}
