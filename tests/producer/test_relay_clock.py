"""A relay measures its host's clock against the outbox database's and warns, once, when it is
off by more than a quarter of the lease: leases are judged by each relay host's clock."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from consumer_kit.core import db_clock
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import build_metadata
from outbox_producer import Relay
from outbox_producer import relay as relay_module
from outbox_producer.metrics import CLOCK_OFFSET, database_label
from tests.clocks import assert_offset_said, clock_warnings
from tests.conftest import Db, database_url
from tests.recording import RecordingTransport

LEASE = dt.timedelta(seconds=30)


def relay(db: Db) -> Relay:
    return Relay(db.engine, RecordingTransport(), table=db.names.outbox, lease=LEASE)


def test_a_relay_whose_clock_agrees_with_the_database_says_nothing(
        server_db: Db, caplog: pytest.LogCaptureFixture) -> None:
    # Given a relay on this host, whose clock the database's agrees with
    r = relay(server_db)
    # When it runs
    r.run_once()
    # Then it measured the offset (under a second on one machine) and warned of nothing
    offset = r.clock.check()
    assert offset is not None and abs(offset.seconds) < 1.0 and offset.error < 1.0
    assert abs(CLOCK_OFFSET.labels(database_label(r.engine))._value.get()) < 1.0
    assert clock_warnings(caplog) == []


def test_a_relay_host_a_minute_ahead_is_warned_once_and_told_when_the_clocks_agree(
        server_db: Db, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # Given a relay host whose clock runs a minute ahead of the database's
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() + dt.timedelta(minutes=1))
    r = relay(server_db)
    # When it runs twice
    r.run_once()
    r.run_once()
    # Then it warned once, with the offset, the lease's half and NTP, and no password
    (warning,) = clock_warnings(caplog)
    assert_offset_said(warning, 60, "ahead of")
    assert warning.startswith("relay on ")
    assert "half the lease (15.0 s)" in warning and "NTP" in warning
    assert "ckit:ckit@" not in warning and "***" in warning
    assert -61 < CLOCK_OFFSET.labels(database_label(r.engine))._value.get() < -59
    # And once the host's clock is set right, it says the clocks agree again
    monkeypatch.setattr(db_clock, "utcnow", utcnow)
    r.run_once()
    warnings = clock_warnings(caplog)
    assert len(warnings) == 2 and "the clocks agree again" in warnings[1]


def test_a_relay_behind_the_database_is_warned_too(
        server_db: Db, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() - dt.timedelta(seconds=20))
    relay(server_db).run_once()
    (warning,) = clock_warnings(caplog)
    assert_offset_said(warning, 20, "behind")


def test_sqlite_reads_the_hosts_own_clock_and_is_not_measured(sqlite_db: Db) -> None:
    assert relay(sqlite_db).clock.check() is None


def test_each_outbox_database_has_its_own_offset_gauge(
        server_db: Db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a relay on the server's second database too (a relay serving two shards)
    url = database_url(server_db.kind, tmp_path, second=True)
    other = make_engine(url)
    metadata = build_metadata(server_db.names, include_transport=False)
    metadata.create_all(other)
    try:
        first = relay(server_db)
        second = Relay(other, RecordingTransport(), table=server_db.names.outbox, lease=LEASE)
        # When the first measures a host a minute ahead, then the second a right one
        monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() + dt.timedelta(minutes=1))
        first.run_once()
        monkeypatch.setattr(db_clock, "utcnow", utcnow)
        second.run_once()
        # Then the first database's gauge still shows its offset
        assert database_label(first.engine) != database_label(second.engine)
        assert CLOCK_OFFSET.labels(database_label(first.engine))._value.get() < -59
        assert abs(CLOCK_OFFSET.labels(database_label(second.engine))._value.get()) < 1
    finally:
        metadata.drop_all(other)
        other.dispose()


def test_a_running_relay_measures_again_with_its_gauges(
        server_db: Db, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # Given a running relay whose start found the clocks agreeing
    monkeypatch.setattr(relay_module, "METRICS_INTERVAL", 0.0)
    r = relay(server_db)
    r.run_once()
    assert clock_warnings(caplog) == []
    # When the host's clock jumps ahead while it runs, and its gauges fall due twice
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() + dt.timedelta(minutes=1))
    r._refresh_metrics_when_due()
    r._refresh_metrics_when_due()
    # Then it warned, without waiting for a new run
    assert len(clock_warnings(caplog)) == 1
