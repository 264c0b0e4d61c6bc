"""A SQL transport consumer measures its host's clock against the database's when it joins its
group and warns when it is off by more than a quarter of the queue lease: members judge each
other's queue leases by their own clocks."""

from __future__ import annotations

import datetime as dt

import pytest

from consumer_kit.core import db_clock
from consumer_kit.core.clock import utcnow
from consumer_kit.core.messages import ConsumeStatus, Subscription
from consumer_kit.transports.sql import SqlTransport
from consumer_kit.transports.sql import group as group_module
from consumer_kit.transports.sql.group import GroupStore
from tests.clocks import assert_offset_said, clock_warnings


def joined(transport: SqlTransport) -> None:
    consumer = transport.consumer("clocked", [Subscription("clock_t", "*")],
                                  lambda _d: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    consumer.shutdown()


def test_a_member_a_lease_ahead_of_the_database_is_warned_when_it_joins(
        transport: SqlTransport, db: tuple[str, str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a consumer host whose clock runs 40 s ahead of the database's (the lease: 30 s)
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() + dt.timedelta(seconds=40))
    # When it joins its group
    joined(transport)
    # Then it warned with the offset, the group and NTP (SQLite reads the host's own clock)
    warnings = clock_warnings(caplog)
    if db[0].startswith("sqlite"):
        assert warnings == []
        return
    (warning,) = warnings
    assert warning.startswith("SQL transport consumer of clocked on ")
    assert_offset_said(warning, 40, "ahead of")
    assert "NTP" in warning


def test_a_member_whose_clock_agrees_says_nothing(
        transport: SqlTransport, caplog: pytest.LogCaptureFixture) -> None:
    joined(transport)
    assert clock_warnings(caplog) == []


def test_a_member_measures_again_every_interval_while_it_runs(
        transport: SqlTransport, db: tuple[str, str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a member that joined with its clock right, measuring at every heartbeat
    monkeypatch.setattr(group_module, "CLOCK_CHECK_EVERY", 0.0)
    joined(transport)  # (its tables made)
    store = GroupStore(transport.db, transport.tables, "clocked", "m1", 30)
    store.heartbeat()
    # When its clock jumps 40 s ahead and it beats again
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() + dt.timedelta(seconds=40))
    store.heartbeat()
    # Then it warned (SQLite reads the host's own clock: nothing to say)
    assert len(clock_warnings(caplog)) == (0 if db[0].startswith("sqlite") else 1)
    store.leave()
