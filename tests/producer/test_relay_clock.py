"""A relay measures its host's clock against the outbox database's and warns, once, when it is
off by more than a quarter of the lease: leases are judged by each relay host's clock."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from consumer_kit.core import db_clock
from consumer_kit.core.clock import utcnow
from outbox_producer import Relay
from outbox_producer.metrics import CLOCK_OFFSET
from tests.conftest import Db
from tests.recording import RecordingTransport

LEASE = dt.timedelta(seconds=30)


def relay(db: Db) -> Relay:
    return Relay(db.engine, RecordingTransport(), table=db.names.outbox, lease=LEASE)


def clock_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "consumer_kit.core.db_clock" and r.levelno == logging.WARNING]


def test_a_relay_whose_clock_agrees_with_the_database_says_nothing(
        server_db: Db, caplog: pytest.LogCaptureFixture) -> None:
    # Given a relay on this host, whose clock the database's agrees with
    r = relay(server_db)
    # When it runs
    r.run_once()
    # Then it measured the offset (under a second on one machine) and warned of nothing
    offset = r.clock.check()
    assert offset is not None and abs(offset.seconds) < 1.0 and offset.error < 1.0
    assert abs(CLOCK_OFFSET._value.get()) < 1.0
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
    assert "this host's clock is 60." in warning and "s ahead of the database's" in warning
    assert warning.startswith("relay on ")
    assert "half the lease (15.0 s)" in warning and "NTP" in warning
    assert "ckit:ckit@" not in warning and "***" in warning
    assert -61 < CLOCK_OFFSET._value.get() < -59
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
    assert "this host's clock is 20." in warning and "s behind the database's" in warning


def test_sqlite_reads_the_hosts_own_clock_and_is_not_measured(sqlite_db: Db) -> None:
    assert relay(sqlite_db).clock.check() is None
