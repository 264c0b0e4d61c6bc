"""A duplicate's processed row is read on the connection that found it taken, never on a second
one while the first is held: consume threads outnumbering the pool's connections would each
hold one and wait for another (every duplicate of a redelivery burst stalled for the pool's
timeout, then retried)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message, Outcome, Reject
from consumer_kit.core.db import make_engine
from consumer_kit.outcome import Result
from consumer_kit.processed import ProcessedRowGone, RowClaim
from consumer_kit.transports.memory import MemoryTransport
from tests.consumer.conftest import Env, add_reservation, delivery

#: seconds a checkout may wait on the one-connection pool (the old code waited this long)
POOL_TIMEOUT = 3


@pytest.fixture
def one_connection(env: Env) -> Iterator[sa.Engine]:
    """`env`'s database behind a pool of exactly one connection."""
    engine = make_engine(env.db.url, pool_size=1, max_overflow=0, pool_timeout=POOL_TIMEOUT)
    yield engine
    engine.dispose()


def _app(env: Env, engine: sa.Engine, *, reject: bool = False) -> ConsumerApp:
    app = ConsumerApp(group=env.group("onepool"), db=engine, redis=None, receipts=None,
                      transport=MemoryTransport(), processed_table=env.db.names.processed,
                      local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        if reject:
            raise Reject("not for us")
        add_reservation(env, session, msg.id)

    return app


def _twice(app: ConsumerApp, message_id: str) -> tuple[Outcome, Result, float]:
    """Deliver `message_id` twice through `app`: the first outcome, the second result and the
    seconds the second took."""
    pipe = app.pipeline()
    try:
        first = pipe.process(delivery(message_id)).outcome
        started = time.monotonic()
        result = pipe.process(delivery(message_id))
        return first, result, time.monotonic() - started
    finally:
        app.close()


def test_a_duplicate_on_a_pool_of_one_connection_is_answered_at_once(
        env: Env, one_connection: sa.Engine) -> None:
    # Given: a message consumed once, on a pool of one connection
    # When: it is delivered again
    first, result, spent = _twice(_app(env, one_connection), "M1")
    assert first is Outcome.SUCCEEDED
    # Then: a duplicate, found without waiting for a second connection; one effect
    assert result.outcome is Outcome.DUPLICATE, result.reason
    assert spent < POOL_TIMEOUT / 2
    assert env.effects() == {"M1": 1}


def test_a_rejection_met_by_its_own_row_on_a_pool_of_one_connection_is_answered_at_once(
        env: Env, one_connection: sa.Engine) -> None:
    # Given: a message rejected once (its FAILED row recorded), on a pool of one connection
    # When: the broker delivers it again and the handler rejects it again
    first, result, spent = _twice(_app(env, one_connection, reject=True), "M2")
    assert first is Outcome.REJECTED
    # Then: the recorded rejection stands (a duplicate that may run again), found at once
    assert result.outcome is Outcome.DUPLICATE, result.reason
    assert spent < POOL_TIMEOUT / 2
    assert env.processed() == [("M2", "FAILED", "not for us")]


def test_a_row_gone_between_the_clash_and_its_read_retries_the_message(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: the store says a row clashed, but there is none when it is read (purged)
    app = env.app(use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.id)

    pipe = app.pipeline()
    store = pipe.store
    monkeypatch.setattr(store, "claim", lambda *a, **k: RowClaim.TAKEN)
    try:
        # When
        result = pipe.process(delivery("M3"))
    finally:
        app.close()
    # Then: consumed again later, with why; no effect
    assert result.outcome is Outcome.RETRY
    assert "gone" in (result.reason or "")
    assert env.effects() == {}
    with env.db.engine.connect() as conn, pytest.raises(ProcessedRowGone):
        store.decide(conn, Message.from_delivery(delivery("M3")))


def test_a_row_gone_after_a_handler_without_a_session_retries_and_dead_letters_at_the_end(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a handler without a session, and its row clashing but gone when read (once per
    # delivery: the dead letter's own row then goes in)
    app = env.app(use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def note(msg: Message) -> None:
        pass

    pipe = app.pipeline()
    real_claim = pipe.store.claim
    gone_once: list[bool] = []

    def claim(*args: Any, **kwargs: Any) -> RowClaim:
        gone_once.append(True)
        return RowClaim.TAKEN if len(gone_once) % 2 else real_claim(*args, **kwargs)

    monkeypatch.setattr(pipe.store, "claim", claim)
    try:
        # When: it is delivered, then delivered for the last time
        first = pipe.process(delivery("M4"))
        gone_once.clear()
        last_delivery = dataclasses.replace(delivery("M4", reconsume=3), max_reconsume_times=3)
        last = pipe.process(last_delivery)
    finally:
        app.close()
    # Then: consumed again later with why (not a pipeline error), and dead-lettered at the end
    assert first.outcome is Outcome.RETRY and "gone" in (first.reason or "")
    assert last.outcome is Outcome.DEAD_LETTER, last
    assert [row[:2] for row in env.processed()] == [("M4", "DEAD_LETTERED")]
