"""A handler that commits its session's connection itself (`session.connection().commit()`,
which the README says not to do) commits the processed row with its writes. The framework saw
only that the transaction had ended and said the handler "rolled back its session; nothing was
recorded", which was false: the row was committed and the redelivery was a duplicate. Now it
tells a commit from a rollback by the processed row, and says what happened."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import registry

from consumer_kit import ConsumerApp, Message, Reject
from consumer_kit.core.messages import ConsumeStatus
from consumer_kit.outcome import Outcome
from consumer_kit.transports.memory import MemoryTransport
from tests.consumer.conftest import Env, add_reservation, delivery
from tests.consumer.test_duplicate_connection import POOL_TIMEOUT, one_connection

__all__ = ["one_connection"]  # (a fixture)


def handling_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "consumer_kit.handling" and r.levelno == level]


def committing_app(env: Env, *, then: str | None = None) -> ConsumerApp:
    """An app whose handler reserves A, commits the session's connection itself, then reserves
    `then` (when given)."""
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        session.connection().commit()
        if then is not None:
            add_reservation(env, session, then)

    return app


def test_a_handler_committing_its_connection_at_the_end_counts_as_processed_and_is_named(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler that writes, then commits the session's connection itself
    app = committing_app(env)
    # When it runs, then the message is processed once: the commit took the processed row along
    first = app.pipeline().process(delivery("M1"))
    assert first.outcome is Outcome.SUCCEEDED, first.reason
    assert [row[:2] for row in env.processed()] == [("M1", "SUCCEEDED")]
    assert env.effects() == {"A": 1}
    # and a warning says what the handler did, not that it rolled back
    (line,) = [w for w in handling_lines(caplog, logging.WARNING) if "M1" in w]
    assert "committed the session's connection itself" in line and "rolled back" not in line
    # and a redelivery is a duplicate
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}
    app.close()


def test_a_handler_writing_after_committing_its_connection_is_an_error_naming_what_is_lost(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler that writes, commits the session's connection, then writes again (which
    # SQLAlchemy refuses: the framework's transaction is closed)
    app = committing_app(env, then="B")
    # When it runs, then the first write and the processed row stay committed, the second is
    # not made, and an error says so: the message counts as processed
    app.pipeline().process(delivery("M1"))
    assert env.effects() == {"A": 1}
    assert [row[:2] for row in env.processed()] == [("M1", "SUCCEEDED")]
    (error,) = handling_lines(caplog, logging.ERROR)
    assert "committed the session's connection itself, then raised" in error
    assert "what the handler meant to do after it is lost" in error
    # and the redelivery is a duplicate: B is never made
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}
    app.close()


def rolls_back(env: Env, session: Any) -> None:
    add_reservation(env, session, "A")  # (a session that ran nothing has nothing to roll back)
    session.rollback()


def commits_itself(env: Env, session: Any) -> None:
    add_reservation(env, session, "A")
    session.connection().commit()


def fails_rolls_back_and_rejects(env: Env, session: Any) -> None:
    add_reservation(env, session, "A")
    try:  # a reservation without a sku breaks a NOT NULL: the handler rolls back and rejects
        session.execute(sa.insert(env.stock).values(sku=None, reserved=1))
    except sa.exc.IntegrityError:
        session.rollback()
    raise Reject("bad data")


@pytest.mark.parametrize(("handler", "outcome"), [
    (rolls_back, Outcome.RETRY), (commits_itself, Outcome.SUCCEEDED),
    (fails_rolls_back_and_rejects, Outcome.REJECTED)])
def test_a_transaction_ended_under_the_handler_is_read_on_its_own_connection(
        env: Env, one_connection: sa.Engine, handler: Callable[[Env, Any], None],
        outcome: Outcome) -> None:
    # Given a pool of one connection, and a handler that ends its transaction under it
    app = ConsumerApp(group=env.group("onepool"), db=one_connection, redis=None, receipts=None,
                      transport=MemoryTransport(), processed_table=env.db.names.processed,
                      local_cache=0)
    app.listener("ORDER_CREATED")(lambda msg, session: handler(env, session))
    try:
        # When it runs, then the outcome comes at once: the processed row is read on the
        # connection the handler had (a second checkout waited the pool's timeout, then failed
        # the message with a TimeoutError that also replaced a Reject)
        started = time.monotonic()
        result = app.pipeline().process(delivery("M1"))
        took = time.monotonic() - started
    finally:
        app.close()
    assert result.outcome is outcome, result.reason
    assert took < POOL_TIMEOUT - 1


def test_a_handler_adding_to_its_session_after_committing_its_connection_is_told_it_is_lost(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler that writes, commits the session's connection, then adds an ORM object
    # (never flushed: the framework's transaction is closed)
    class Reservation:
        def __init__(self, sku: str) -> None:
            self.sku, self.reserved = sku, 1

    registry().map_imperatively(Reservation, env.stock)
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        session.connection().commit()
        session.add(Reservation("B"))

    # When it runs, then the message counts as processed, B is not made, and an error says it
    # is lost (a warning said "its writes ... were committed")
    assert app.pipeline().process(delivery("M1")).outcome is Outcome.SUCCEEDED
    assert env.effects() == {"A": 1}
    (error,) = handling_lines(caplog, logging.ERROR)
    assert "then changed its session, never written" in error
    assert "what the handler meant to do after it is lost" in error
    app.close()
