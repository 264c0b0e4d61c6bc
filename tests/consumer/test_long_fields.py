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

        # Given a message whose tags PostgreSQL cannot store (a NUL), matching no listener
        # When it is rejected
        rejected = app.pipeline().process(delivery("M1", tags="a\x00b"))
        # Then the reason names a data error, not an outage (the outcome is still a retry)
        assert "data error, not an outage" in rejected.reason
        assert "database unavailable" not in rejected.reason
