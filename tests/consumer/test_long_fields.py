"""Message fields longer than their processed-table column are fitted, never a failed write.

A `ckit_src` of 200 characters was written whole into `src` (128): MariaDB and PostgreSQL
refused the row, so a handler with a session could never succeed, one without a session
applied its effect on every redelivery, and the dead letter was recorded nowhere."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import Message
from consumer_kit.core.schema import NAME_LEN, TAGS_LEN, TOPIC_LEN
from consumer_kit.outcome import Outcome
from consumer_kit.transports import ConsumeStatus
from tests.consumer.conftest import Env, add_reservation, delivery

LONG_SRC = "s" * 200


def _row(env: Env) -> tuple[str, str, str | None, str]:
    with env.db.engine.connect() as conn:
        return tuple(conn.execute(sa.text(  # type: ignore[return-value]
            f"SELECT message_id, topic, tags, src FROM {env.db.names.processed}")).one())


@pytest.mark.parametrize("session", [True, False], ids=["with-session", "without-session"])
def test_a_ckit_src_longer_than_its_column_is_fitted_and_the_message_recorded_once(
        real_env: Env, session: bool) -> None:
    env = real_env
    app = env.app()

    # Given a handler (with or without a session) writing one reservation per run
    if session:
        @app.listener("ORDER_CREATED")
        def reserve(msg: Message, session: Any) -> None:
            add_reservation(env, session, "A")
    else:
        @app.listener("ORDER_CREATED")
        def reserve_alone(msg: Message) -> None:
            with env.db.engine.begin() as conn:
                conn.execute(sa.insert(env.stock).values(sku="A", reserved=1))

    # When a message with a 200-character ckit_src is delivered, then redelivered
    first = app.process(delivery("M1", src=LONG_SRC))
    again = app.process(delivery("M1", src=LONG_SRC, reconsume=1))
    # Then it ran once and is recorded, its src fitted to the column
    assert first.status is ConsumeStatus.CONSUME_SUCCESS
    assert again.status is ConsumeStatus.CONSUME_SUCCESS
    assert env.effects() == {"A": 1}
    assert [(m, s) for m, s, _ in env.processed()] == [("M1", "SUCCEEDED")]
    assert _row(env)[3] == LONG_SRC[:NAME_LEN]


def test_every_message_field_the_processed_row_takes_is_fitted(real_env: Env) -> None:
    env = real_env
    app = env.app()

    @app.listener("*")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    # When a message comes with topic, tags and src each longer than its column
    topic, tags = "T" * 300, "g" * 300
    result = app.process(delivery("M1", topic=topic, tags=tags, src=LONG_SRC))
    # Then it is recorded with each fitted
    assert result.status is ConsumeStatus.CONSUME_SUCCESS
    assert _row(env) == ("M1", topic[:TOPIC_LEN], tags[:TAGS_LEN], LONG_SRC[:NAME_LEN])


@pytest.mark.postgresql
@pytest.mark.redis
def test_a_row_the_database_refuses_says_so_instead_of_database_unavailable(
        tmp_path: Any) -> None:
    from tests.consumer.conftest import _env

    for env in _env("postgresql", tmp_path):
        app = env.app()

        @app.listener("ORDER_CANCELLED")
        def release(msg: Message) -> None:
            pass

        # Given a processed table whose tags column is narrower than consumer-kit's (a table
        # changed by hand), and a message whose tags fit consumer-kit's but not that one,
        # matching no listener
        with env.db.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {env.db.names.processed} "
                                 "ALTER COLUMN tags TYPE VARCHAR(3)"))
        # When it is rejected
        rejected = app.pipeline().process(delivery("M1", tags="abcdef"))
        # Then the reason names a data error, not an outage (the outcome is still a retry)
        assert "data error, not an outage" in rejected.reason
        assert "database unavailable" not in rejected.reason


def test_a_nul_or_a_lone_surrogate_in_a_message_s_fields_or_id_is_stored_once(
        real_env: Env) -> None:
    env = real_env
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, "A")

    # Given messages whose tags, src and KEYS hold a NUL (PostgreSQL's text refuses it) or a
    # lone surrogate (not UTF-8): every write of their processed row used to fail
    nul = delivery(None, keys="order\x001", tags="a\x00b", src="sr\x00c")
    odd = delivery(None, keys="order\udc801", tags="x\udc80y")
    # When each is delivered twice
    results = [app.pipeline().process(d) for d in (nul, odd, nul, odd)]
    # Then each ran once and is recorded: ids fitted (distinct, hashed), fields without them
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 2 + [Outcome.DUPLICATE] * 2, \
        results
    assert env.effects() == {"A": 2}
    rows = env.processed()
    assert len(rows) == 2 and {status for _, status, _ in rows} == {"SUCCEEDED"}
    ids = sorted(message_id for message_id, _, _ in rows)
    assert ids[0].startswith("order1~") and ids[1].startswith("order1~") and ids[0] != ids[1]
    with env.db.engine.connect() as conn:
        stored = set(conn.execute(sa.text(
            f"SELECT tags, src FROM {env.db.names.processed}")).tuples())
    assert stored == {("ab", "src"), ("x\ufffdy", "orders")}
