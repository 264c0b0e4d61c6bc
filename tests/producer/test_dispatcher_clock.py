"""The after-commit dispatcher measures its host's clock against the outbox database's and
warns, once, when it is off by more than a quarter of the lease: its send leases are written with
its host's clock and judged by the relays'. It used to measure nothing: a publisher host a
minute behind wrote leases the relays saw expired at once (a second send)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any

import pytest
from sqlalchemy.orm import Session

from consumer_kit.core import db_clock
from consumer_kit.core.clock import utcnow
from outbox_producer import Dispatcher, Outbox
from outbox_producer import dispatcher as dispatcher_module
from outbox_producer.metrics import DISPATCHER_CLOCK_OFFSET, database_label
from tests.clocks import assert_offset_said, clock_warnings
from tests.conftest import Db
from tests.recording import RecordingTransport

LEASE = dt.timedelta(seconds=30)


def publish_through(dispatcher: Dispatcher, db: Db, keys: range) -> list[str]:
    """Publish one row per key in one Session's transaction (the dispatcher takes a Session's
    rows after its commit), and wait until the dispatcher handled them."""
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    with Session(db.engine) as session, session.begin():
        ids = [outbox.publish(session, "T", {"k": k}, biz_type="t", biz_key=str(k))
               for k in keys]
    assert dispatcher.flush(10)
    return ids


def test_a_dispatcher_host_a_minute_behind_is_warned_once_after_its_first_batch(
        server_db: Db, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # Given a dispatcher on a host whose clock runs a minute behind the database's
    monkeypatch.setattr(db_clock, "utcnow", lambda: utcnow() - dt.timedelta(minutes=1))
    transport = RecordingTransport()
    dispatcher = Dispatcher(server_db.engine, transport, table=server_db.names.outbox,
                            lease=LEASE).start()
    try:
        # When it sends two batches
        ids = publish_through(dispatcher, server_db, range(3))
        ids += publish_through(dispatcher, server_db, range(3, 5))
    finally:
        dispatcher.close()
    # Then it sent them, and warned once, with the offset, half the lease and NTP, no password
    assert transport.counts() == {m: 1 for m in ids}
    (warning,) = clock_warnings(caplog)
    assert warning.startswith("dispatcher on ")
    assert_offset_said(warning, 60, "behind")
    assert "half the lease (15.0 s)" in warning and "NTP" in warning
    assert "ckit:ckit@" not in warning and "***" in warning
    assert 59 < DISPATCHER_CLOCK_OFFSET.labels(database_label(dispatcher.engine))._value.get() < 61


def test_a_dispatcher_measures_again_only_after_clock_check_every(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a dispatcher whose clock checks are counted
    checks: list[float] = []
    measure = db_clock.clock_offset
    monkeypatch.setattr(db_clock, "clock_offset",
                        lambda engine: checks.append(1) or measure(engine))
    dispatcher = Dispatcher(server_db.engine, RecordingTransport(),
                            table=server_db.names.outbox).start()
    try:
        # When it sends three batches, the third after CLOCK_CHECK_EVERY is made to have passed
        publish_through(dispatcher, server_db, range(2))
        publish_through(dispatcher, server_db, range(2, 4))
        assert len(checks) == 1  # the first batch measured; the second, within a minute, not
        monkeypatch.setattr(dispatcher, "_next_clock_check", 0.0)
        publish_through(dispatcher, server_db, range(4, 6))
    finally:
        dispatcher.close()
    # Then it measured after the first and the third only, and the clocks agree: no warning
    assert len(checks) == 2
    assert dispatcher.clock.skewed is False
    assert dispatcher_module.CLOCK_CHECK_EVERY == 60.0


def test_a_dispatcher_on_sqlite_reads_the_hosts_own_clock_and_measures_nothing(
        sqlite_db: Db) -> None:
    assert Dispatcher(sqlite_db.engine, RecordingTransport(),
                      table=sqlite_db.names.outbox).clock.check() is None


def test_a_slow_clock_measurement_keeps_no_row_and_no_flush_waiting(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a dispatcher whose clock measurement hangs until released
    release = threading.Event()

    def hanging(_engine: Any) -> None:
        release.wait(30)

    monkeypatch.setattr(db_clock, "clock_offset", hanging)
    transport = RecordingTransport()
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox).start()
    try:
        # When a batch is sent (its measurement then hangs), then flush returns: the batch is
        # handled (flush used to wait for the measurement inside the batch)
        ids = publish_through(dispatcher, sqlite_db, range(2))
        assert transport.counts() == {m: 1 for m in ids}
    finally:
        release.set()
        dispatcher.close()


def test_a_clock_measurement_that_raises_is_one_warning_not_a_failed_batch(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    # Given a dispatcher whose clock measurement raises something unexpected
    def broken(_engine: Any) -> None:
        raise RuntimeError("clock source gone")

    monkeypatch.setattr(db_clock, "clock_offset", broken)
    transport = RecordingTransport()
    dispatcher = Dispatcher(sqlite_db.engine, transport, table=sqlite_db.names.outbox).start()
    try:
        ids = publish_through(dispatcher, sqlite_db, range(2))
    finally:
        dispatcher.close()
    # Then the rows were sent, and one warning names the measurement, not the batch
    assert transport.counts() == {m: 1 for m in ids}
    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name.startswith(("outbox_producer", "consumer_kit.core.batching"))]
    assert lines == [(logging.WARNING, "dispatcher: could not measure this host's clock "
                      "against the database's: RuntimeError: clock source gone")]
