"""A handler whose transaction ends under it (it rolled back its session, or its commit of the
session's connection failed) while another consumer of the group processes the same message:
the rollback frees the processed row's lock, the other delivery's INSERT goes on and commits,
and the processed row reads SUCCEEDED when this one looks. The framework took that row for the
handler's own commit: it warned that the handler "committed the session's connection itself"
(an error when it raised after), and counted a success it did not have (or asked for a
redelivery). It now knows how the transaction ended, and says what happened: the other delivery
processed the message, a duplicate with nothing to retry."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Outcome
from consumer_kit.core import tracked
from consumer_kit.core.messages import ConsumeStatus
from consumer_kit.outcome import Result
from tests.consumer.conftest import Env, add_reservation, delivery


def handling_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("consumer_kit") and r.levelno >= level]


def session_rollback(session: Any) -> None:
    session.rollback()


def connection_rollback(session: Any) -> None:
    session.connection().rollback()


def racing_apps(env: Env, end: Callable[[Any], None], then_raise: bool
                ) -> tuple[ConsumerApp, list[Result]]:
    """Two consumers of one group, adaptive (the processed row is the lease). The first one's
    handler writes, then lets the second one's delivery of the same message start (its INSERT
    waits on the first one's row), ends its transaction with `end`, waits for the second one to
    succeed, then returns (or raises). Returns the first app and the second one's results."""
    first, second = (env.app(group="race", redis_claims="adaptive", local_cache=0)
                     for _ in range(2))
    results: list[Result] = []

    @second.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    other = threading.Thread(target=lambda: results.append(
        second.pipeline().process(delivery("M1"))), name="race-second-consumer")

    @first.listener("ORDER_CREATED")
    def reserve_then_end(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        session.flush()
        other.start()
        other.join(0.3)
        assert not results, "the second delivery did not wait on the processed row's lock"
        end(session)  # frees the row: the second delivery inserts it and commits
        other.join(30)
        assert results, "the second delivery did not finish"
        if then_raise:
            raise RuntimeError("the handler's own error after its rollback")

    return first, results


@pytest.mark.parametrize("then_raise", [False, True], ids=["returns", "raises"])
@pytest.mark.parametrize("end", [session_rollback, connection_rollback])
def test_a_rollback_racing_another_consumers_success_is_a_duplicate_said_as_such(
        env: Env, caplog: pytest.LogCaptureFixture, end: Callable[[Any], None],
        then_raise: bool) -> None:
    # Given a handler that rolls its transaction back while another consumer of the group
    # processes the same message
    app, second = racing_apps(env, end, then_raise)
    # When it runs
    with caplog.at_level(logging.INFO, logger="consumer_kit"):
        result = app.pipeline().process(delivery("M1"))
    # Then the other consumer processed it, once
    assert [r.outcome for r in second] == [Outcome.SUCCEEDED]
    assert env.effects() == {"A": 1}
    assert [row[:2] for row in env.processed()] == [("M1", "SUCCEEDED")]
    # and this delivery is its duplicate: acked, nothing to retry, no success of its own
    assert result.outcome is Outcome.DUPLICATE, result
    assert "concurrent delivery" in (result.reason or "")
    # and one warning says so, not that the handler committed, nor that it is retried
    assert handling_lines(caplog, logging.ERROR) == []
    (line,) = [w for w in handling_lines(caplog, logging.WARNING) if "M1" in w]
    assert "rolled back" in line and "processed by a concurrent delivery" in line
    assert "a duplicate, nothing to retry" in line
    assert "committed the session's connection" not in line and "reconsume" not in line
    if then_raise:
        assert "the handler's own error after its rollback" in line
    # and a redelivery is a duplicate too
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}
    app.close()


def test_a_rollback_with_no_concurrent_success_still_says_nothing_was_recorded(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler that rolls its session back, with no other consumer around
    app = env.app(group="race", use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        session.rollback()

    # When it runs, then nothing is recorded and it is consumed again later, as before
    with caplog.at_level(logging.INFO, logger="consumer_kit"):
        result = app.pipeline().process(delivery("M1"))
    assert result.outcome is Outcome.RETRY and env.processed() == []
    (line,) = [w for w in handling_lines(caplog, logging.WARNING) if "M1" in w]
    assert "rolled back its session; nothing was recorded, reconsume later" in line
    app.close()


@pytest.mark.parametrize("lost", [False, True], ids=["refused", "connection-lost"])
def test_a_commit_of_the_sessions_connection_that_failed_is_not_taken_for_a_commit(
        env: Env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        lost: bool) -> None:
    # Given a handler that commits the session's connection itself, and a database that
    # refuses that commit and rolls the transaction back (a deferred constraint, a Galera
    # certification failure), or loses the connection as it commits, while another consumer
    # of the group processes the same message
    app, second = racing_apps(
        env, lambda session: commit_refused(session, monkeypatch, lost), then_raise=False)
    # When it runs
    with caplog.at_level(logging.INFO, logger="consumer_kit"):
        result = app.pipeline().process(delivery("M1"))
    # Then it is the other delivery's duplicate, and no line says the handler's commit held
    assert [r.outcome for r in second] == [Outcome.SUCCEEDED]
    assert result.outcome is Outcome.DUPLICATE, result
    assert env.effects() == {"A": 1}
    assert handling_lines(caplog, logging.ERROR) == []
    (line,) = [w for w in handling_lines(caplog, logging.WARNING) if "M1" in w]
    assert "committed the session's connection, and the commit failed" in line
    assert "commit refused" in line and "nothing to retry" in line
    assert "connection itself" not in line and "reconsume" not in line
    # (a commit that lost its connection may have taken effect: the line says it cannot tell)
    assert ("took effect before the connection was lost, or the message was processed by a "
            "concurrent delivery" in line) is lost
    assert ("processed by a concurrent delivery meanwhile" in line) is not lost
    assert ("answer was lost" in (result.reason or "")) is lost  # (the reason says the same)
    app.close()


def commit_refused(session: Any, monkeypatch: pytest.MonkeyPatch, lost: bool) -> None:
    """Commit the session's connection, which the database refuses: rolled back, then the
    driver's error (a disconnect when `lost`), swallowed here as a handler catching it would."""
    conn = session.connection()
    dialect = conn.dialect

    def refuse(dbapi_connection: Any) -> None:
        del dialect.do_commit  # this commit only (the other consumer's is its own)
        dbapi_connection.rollback()
        raise dialect.loaded_dbapi.OperationalError("commit refused")

    if lost:
        monkeypatch.setattr(dialect, "is_disconnect",
                            lambda error, *_: "commit refused" in str(error))
    dialect.do_commit = refuse
    with contextlib.suppress(sa.exc.OperationalError):
        conn.commit()


def test_a_tracked_transaction_is_refused_on_a_connection_that_has_one(env: Env) -> None:
    # Given a connection in a transaction, then a tracked one is refused as begin() refuses it
    with env.db.engine.connect() as conn, conn.begin(), pytest.raises(
            sa.exc.InvalidRequestError, match="already initialized"):
        tracked.begin(conn)
