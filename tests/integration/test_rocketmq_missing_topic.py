"""`create_topics=False` (the default) on `rocketmq://`: running an app on a topic that does not
exist never creates it (a typo in a listener's topic must not become a new topic), and the
consumer says at start that it waits for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer_kit import ConsumerApp
from consumer_kit.testing.harness import unique
from consumer_kit.transports.rocketmq import RocketMQTransport
from tests import services
from tests.conftest import Db

pytestmark = [pytest.mark.rocketmq]


def test_an_app_on_a_missing_topic_does_not_create_it_without_create_topics_and_says_so(
    tmp_path: Path, sqlite_db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    services.require("rocketmq", services.ping_rocketmq)
    # Given: a transport without create_topics, a listener on a topic that does not exist
    transport = RocketMQTransport(services.rocketmq_addr(),
                                  client_log_dir=str(tmp_path / "rocketmq-cpp"))
    missing, group = unique("ckit_no_such_topic4"), unique("g_missing4")
    assert transport.admin.topic_route(missing) is None
    app = ConsumerApp(group=group, db=sqlite_db.engine, redis=None, receipts=None,
                      processed_table=sqlite_db.names.processed, transport=transport)
    app.listener(missing)(lambda msg, session: None)
    # When
    try:
        app.run(max_seconds=1)
    finally:
        app.close()
    # Then: not created, and the consumer said it waits for it
    assert transport.admin.topic_route(missing) is None
    assert f"topic {missing} does not exist (no route): it waits for it" in caplog.text
