"""A claim that lost to another relay's (a deadlock; on a Galera cluster, a relay on another
node certified first) was rolled back whole and sent nothing: the relay claims again at once
instead of waiting it out as an outage. It used to log a warning and wait the doubling outage
back-off for each one, so a relay on a second Galera node sent almost nothing
(docs/scale-out.md, tests/integration/test_galera_cluster.py, bench/galera_relays.py)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from consumer_kit.core.states import OutboxState
from outbox_producer import Relay, metrics
from outbox_producer import relay as relay_module
from tests.conftest import Db
from tests.producer.test_relay_partial import outbox_states
from tests.producer.test_retention import publish
from tests.recording import RecordingTransport


def lost_claim(engine: sa.Engine) -> exc.DBAPIError:
    """The error a claim that lost to a concurrent one raises on `engine`'s server, as the
    driver raises it and SQLAlchemy wraps it (a real one: tests/test_db_errors.py)."""
    if engine.dialect.name == "postgresql":
        import psycopg

        orig: Exception = psycopg.errors.DeadlockDetected("deadlock detected")
        base: type[Exception] = psycopg.Error
    else:
        import pymysql

        orig = pymysql.err.OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction")
        base = pymysql.err.Error
    return exc.DBAPIError.instance("UPDATE outbox ...", {}, orig, base)


def lock_timeout(engine: sa.Engine) -> exc.DBAPIError:
    """An outage that is no lost claim: a lock wait timeout, as the driver raises it."""
    if engine.dialect.name == "postgresql":
        import psycopg

        return exc.DBAPIError.instance("UPDATE outbox ...", {}, psycopg.errors.LockNotAvailable(
            "canceling statement due to lock timeout"), psycopg.Error)
    import pymysql

    return exc.DBAPIError.instance("UPDATE outbox ...", {}, pymysql.err.OperationalError(
        1205, "Lock wait timeout exceeded; try restarting transaction"), pymysql.err.Error)


def scripted(relay: Relay, script: list[str]) -> list[str]:
    """Make `relay`'s next claims follow `script`, one entry per claim: "lost" (to another
    relay's, before it reaches the database), "outage" (a lock timeout) or "claim" (the real
    claim); then real claims. Returns what is left of the script."""
    left = list(script)
    claim = relay.claimer.claim

    def next_claim(size: int, *args: Any, **kwargs: Any) -> Any:
        what = left.pop(0) if left else "claim"
        if what == "lost":
            raise lost_claim(relay.engine)
        if what == "outage":
            raise lock_timeout(relay.engine)
        return claim(size, *args, **kwargs)

    relay.claimer.claim = next_claim  # type: ignore[method-assign]
    return left


def test_a_claim_lost_to_another_relay_is_claimed_again_at_once_not_waited_out(
        server_db: Db, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # (an outage would wait 2 s, counted and logged, each time)
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (2.0, 2.0))
    ids = publish(server_db, range(30))
    lost_before = metrics.CLAIMS_LOST._value.get()
    # Given a relay whose first three claims lose to another relay's
    relay = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox, batch=10)
    left = scripted(relay, ["lost"] * 3)
    # When it drains, then it claims again at once: no outage counted or logged
    result = relay.run_once()
    assert left == []
    assert result.errors == 0 and result.stats.sent == len(ids)
    assert "retry in" not in caplog.text
    assert metrics.CLAIMS_LOST._value.get() - lost_before == 3
    assert set(outbox_states(server_db.engine, server_db.names.outbox).values()) == {
        OutboxState.SENT}


def test_claims_lost_too_many_times_in_a_row_are_waited_out_as_an_outage(
        server_db: Db, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.01, 0.02))
    monkeypatch.setattr(relay_module, "CLAIM_AGAIN_TIMES", 2)
    ids = publish(server_db, range(5))
    # Given a relay whose claims lose four times in a row (two more than it claims again)
    relay = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox)
    left = scripted(relay, ["lost"] * 4)
    # When it drains, then the third is an outage: counted, logged with its cause, waited out;
    # after that wait the count starts again (the fourth is claimed again)
    result = relay.run_once()
    assert left == [] and result.errors == 1 and result.stats.sent == len(ids)
    cause = ("DeadlockDetected: deadlock detected" if server_db.kind == "postgresql"
             else "OperationalError: (1213, 'Deadlock found when trying to get lock")
    assert f"claim lost to another relay's: {cause}" in caplog.text
    assert "(3 in a row); retry in" in caplog.text and "4 in a row" not in caplog.text


@pytest.mark.parametrize(("between", "errors"), [
    ("claim", 0), ("outage", 1), ("broker outage", 1)])
def test_lost_claims_count_in_a_row_only_until_a_batch_or_an_outage_comes_between(
        server_db: Db, monkeypatch: pytest.MonkeyPatch, between: str, errors: int) -> None:
    monkeypatch.setattr(relay_module, "OUTAGE_BACKOFF", (0.01, 0.02))
    monkeypatch.setattr(relay_module, "CLAIM_AGAIN_TIMES", 2)
    ids = publish(server_db, range(4))
    # Given a relay whose claims lose twice (as many as it claims again), then a batch is
    # claimed (or a database outage comes, or a batch is claimed whose send meets a broker
    # outage), then they lose twice more
    transport = RecordingTransport()
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, batch=1)
    if between == "broker outage":
        transport.fail_next = 1
    left = scripted(relay, ["lost", "lost", "outage" if between == "outage" else "claim",
                            "lost", "lost"])
    # When it drains, then no four losses were taken for one run of them: nothing was an
    # outage but the outage
    result = relay.run_once()
    assert left == [] and result.errors == errors and result.stats.sent == len(ids)
    assert transport.counts() == {m: 1 for m in ids}


def test_a_lasting_error_from_the_claim_still_stops_the_relay(
        server_db: Db) -> None:
    # Given a claim that fails with an error waiting cannot fix (its table is gone)
    publish(server_db, range(2))
    relay = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox)
    with server_db.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {server_db.names.outbox}")
    # When the relay drains, then it stops with that error at once: it is no lost claim
    with pytest.raises(exc.DBAPIError):
        relay.run_once()
