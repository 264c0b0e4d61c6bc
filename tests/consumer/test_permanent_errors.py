"""`permanent_errors=` / `permanent=` broad enough to hold database errors (`Exception`,
`SQLAlchemyError`): a lock timeout, a deadlock or an outage is never the message's fault."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import Message, Retry
from consumer_kit.transports import ConsumeStatus
from tests.consumer.conftest import Env, add_reservation, delivery


def _lock_wait(env: Env, session: Any) -> None:
    """Wait on a row lock another transaction holds, until the database gives up (a real lock
    timeout on MariaDB and PostgreSQL; SQLite's "database is locked", as its driver says it)."""
    if env.kind == "sqlite":
        raise sa.exc.OperationalError("UPDATE stock", {}, sqlite3.OperationalError(
            "database is locked"))
    if env.kind == "mariadb":
        session.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
    else:
        session.execute(sa.text("SET LOCAL lock_timeout = '1s'"))
    session.execute(sa.update(env.stock).values(reserved=2))


def test_a_lock_timeout_in_a_handler_is_retried_even_when_every_exception_is_permanent(
        env: Env) -> None:
    # Given an app that rejects whatever its handlers raise, and a row another transaction holds
    app = env.app(permanent_errors=(Exception,))
    calls: list[int] = []

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            _lock_wait(env, session)
        add_reservation(env, session, "A")

    with env.db.engine.connect() as holder:
        holder.execute(sa.insert(env.stock).values(sku="held", reserved=1))
        holder.commit()
        if env.kind != "sqlite":
            holder.execute(sa.update(env.stock).values(reserved=3))  # holds the row lock
        # When
        first = app.process(delivery("M1"))
        holder.rollback()
    # Then it comes back (not FAILED, acked, the producer told it was rejected), and applies
    assert first.status is ConsumeStatus.RECONSUME_LATER, first
    assert env.processed() == []
    assert app.process(delivery("M1", reconsume=1)).status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1, "held": 1}


def test_a_listeners_permanent_sqlalchemy_error_still_rejects_what_waiting_cannot_fix(
        env: Env) -> None:
    # Given a listener that treats SQLAlchemy errors as permanent, and a handler whose SQL is
    # wrong (a table that is not there: no redelivery fixes it)
    app = env.app()

    @app.listener("ORDER_CREATED", permanent=(sa.exc.SQLAlchemyError,))
    def reserve(msg: Message, session: Any) -> None:
        session.execute(sa.text("SELECT * FROM revh_no_such_table"))

    # When
    result = app.process(delivery("M1"))
    # Then
    assert result.status is ConsumeStatus.CONSUME_SUCCESS
    assert [status for _, status, _ in env.processed()] == ["FAILED"]


@pytest.mark.parametrize("asks", ["raises Retry", "returns RECONSUME_LATER"])
def test_a_handler_asking_for_a_retry_is_retried_even_when_every_exception_is_permanent(
        env: Env, asks: str) -> None:
    # Given an app that rejects whatever its handlers raise (Retry is an Exception too)
    app = env.app(permanent_errors=(Exception,))

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> Any:
        if asks == "raises Retry":
            raise Retry("stock service busy")
        return ConsumeStatus.RECONSUME_LATER

    # When
    result = app.process(delivery("M1"))
    # Then it comes back later, as asked: not FAILED and acked
    assert result.status is ConsumeStatus.RECONSUME_LATER, result
    assert env.processed() == []
