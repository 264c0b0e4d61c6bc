"""The heart of the product: each message's effect is applied once per consumer group."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from consumer_kit import Message, Outcome
from consumer_kit.transports import ConsumeStatus
from tests.consumer.conftest import Env, add_reservation, delivery


@pytest.mark.parametrize("times", [2, 3, 5])
def test_the_same_message_delivered_n_times_applies_its_effect_once(env: Env, times: int) -> None:
    # Given
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, msg.json()["sku"])

    # When
    statuses = [app.process(delivery("M1", reconsume=i)) for i in range(times)]
    # Then
    assert [s.status for s in statuses] == [ConsumeStatus.CONSUME_SUCCESS] * times
    assert env.effects() == {"A": 1}
    assert [(m, s) for m, s, _ in env.processed()] == [("M1", "SUCCEEDED")]


def test_duplicates_are_caught_by_the_processed_table_without_redis(env: Env) -> None:
    app = env.app(use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    results = [app.pipeline().process(delivery("M1")) for _ in range(3)]
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED, Outcome.DUPLICATE,
                                            Outcome.DUPLICATE]
    assert env.effects() == {"A": 1}


def test_a_redis_flush_between_deliveries_still_applies_once(env: Env) -> None:
    app = env.app(local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    assert app.pipeline().process(delivery("M1")).outcome is Outcome.SUCCEEDED
    redis_store = app.pipeline().redis
    assert redis_store is not None and redis_store.flush()  # the done marker reached Redis
    env.redis.flushdb()
    result = app.pipeline().process(delivery("M1"))
    assert result.outcome is Outcome.DUPLICATE
    assert result.reason == "processed row exists"
    assert env.effects() == {"A": 1}


def test_two_apps_of_one_group_share_the_dedupe(env: Env) -> None:
    apps = [env.app(), env.app()]
    for app in apps:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(env, session, "A")

    assert apps[0].pipeline().process(delivery("M1")).outcome is Outcome.SUCCEEDED
    first_redis = apps[0].pipeline().redis
    assert first_redis is not None and first_redis.flush()
    assert apps[1].pipeline().process(delivery("M1")).outcome is Outcome.DUPLICATE
    assert env.effects() == {"A": 1}


def test_another_group_applies_its_own_effect(env: Env) -> None:
    first, second = env.app(group="inventory"), env.app(group="billing")
    for app in (first, second):
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(env, session, "A")
    first.process(delivery("M1"))
    second.process(delivery("M1"))
    assert env.effects() == {"A": 2}


@pytest.mark.parametrize("use_redis", [True, False], ids=["redis", "db-only"])
def test_two_consumers_receiving_the_same_message_at_once_apply_it_once(
    real_env: Env, use_redis: bool
) -> None:
    # Given: two consumer processes' worth of pipelines, each with its own connections
    apps = [real_env.app(use_redis=use_redis, local_cache=0) for _ in range(2)]
    both_inside = threading.Barrier(2, timeout=1.5)
    for app in apps:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(real_env, session, "A")
            # only reachable by both without Redis: the DB must decide
            with contextlib.suppress(threading.BrokenBarrierError):
                both_inside.wait()

    results: dict[int, Outcome] = {}
    start = threading.Barrier(2)

    def deliver(i: int) -> None:
        start.wait()
        results[i] = apps[i].pipeline().process(delivery("SAME")).outcome

    # When
    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then
    assert real_env.effects() == {"A": 1}
    assert sorted(o.value for o in results.values()) in (
        ["busy", "succeeded"], ["duplicate", "succeeded"])


def test_many_threads_racing_over_many_duplicated_messages_apply_each_once(
    real_env: Env
) -> None:
    apps = [real_env.app(local_cache=0) for _ in range(3)]
    for app in apps:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(real_env, session, msg.json()["sku"])

    skus = [f"S{i}" for i in range(30)]
    pending = [(sku, app) for sku in skus for app in apps for _ in range(2)]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                sku, app = pending.pop()
            status = ConsumeStatus.RECONSUME_LATER
            while status is ConsumeStatus.RECONSUME_LATER:  # busy -> the broker redelivers
                status = app.process(delivery(f"id-{sku}", f'{{"sku": "{sku}"}}'.encode())).status

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert real_env.effects() == {sku: 1 for sku in skus}


def test_a_deadlock_with_no_concurrent_success_is_still_retried(real_env: Env) -> None:
    # A transaction rolled back by a deadlock is a duplicate only when a concurrent delivery
    # of the message recorded it (tests/integration/test_galera_cluster.py: two Galera nodes);
    # a deadlock with some other transaction leaves nothing recorded: reconsume later
    from tests.producer.test_relay_claim_lost import lost_claim

    app = real_env.app(use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(real_env, session, "A")
        raise lost_claim(real_env.db.engine)

    result = app.pipeline().process(delivery("M1"))
    assert result.outcome is Outcome.RETRY
    assert "Deadlock found" in result.reason or "deadlock detected" in result.reason
    assert real_env.effects() == {} and real_env.processed() == []


def test_a_lost_race_whose_winner_cannot_be_read_is_still_retried(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a handler whose transaction lost to a concurrent one, and a pool too busy to read
    # whether a concurrent delivery of the message won (the pool's TimeoutError)
    import sqlalchemy as sa

    from consumer_kit import handling

    def pool_busy(engine: sa.Engine) -> bool:
        raise sa.exc.TimeoutError("QueuePool limit of size 1 overflow 0 reached")

    monkeypatch.setattr(handling, "is_conflict", lambda error, dialect: True)
    monkeypatch.setattr(handling, "is_galera_node", pool_busy)
    app = env.app(use_redis=False, local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")
        raise sa.exc.OperationalError("INSERT", {}, Exception("deadlock"))

    # When it is processed, then it is a retry like any database error, never an exception
    result = app.pipeline().process(delivery("M1"))
    assert result.outcome is Outcome.RETRY and "deadlock" in result.reason
    assert env.effects() == {}
