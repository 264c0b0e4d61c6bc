"""How `ConsumerApp` wires its configuration: the transport given to `run`, the Redis URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.receipt import receipt_topic
from consumer_kit.core.schema import processed_table
from consumer_kit.dedupe.owner import store_identity
from consumer_kit.transports.base import SendResult
from consumer_kit.transports.memory import MemoryTransport
from tests import services
from tests.conftest import database_url

#: nothing listens on port 1: Redis is down when the app starts
REDIS_DOWN = "redis://127.0.0.1:1/0"


class Recording(MemoryTransport):
    """A memory transport that remembers the topics sent to."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def send(self, message: OutgoingMessage) -> SendResult:
        self.sent.append(message.topic)
        return super().send(message)


def _app(tmp_path: Any, transport: MemoryTransport | None) -> ConsumerApp:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/consumer.db")
    processed_table(sa.MetaData(), "ckit_processed").create(engine)
    app = ConsumerApp(group="wiring", db=engine, redis=REDIS_DOWN, transport=transport,
                      receipts="topic")

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        pass

    return app


def _publish(transport: MemoryTransport) -> None:
    transport.send(OutgoingMessage("ORDER_CREATED", b"{}",
                                   properties={"ckit_id": "M1", "ckit_src": "orders"}))


def test_receipts_go_to_the_transport_given_to_run_when_redis_is_down_at_start(
        tmp_path: Any) -> None:
    # Given an app built with one transport, run on another, Redis down at start
    built, given = Recording(), Recording()
    app = _app(tmp_path, built)
    _publish(given)
    # When
    app.run(transport=given, burst=True, max_seconds=30)
    app.close()
    # Then the receipt went where the message came from, not to the constructor's transport
    assert receipt_topic("orders") in given.sent
    assert built.sent == []


def test_an_app_without_a_transport_of_its_own_runs_on_the_one_given_when_redis_is_down(
        tmp_path: Any) -> None:
    # Given an app with no transport (it is given to run), Redis down at start
    given = Recording()
    app = _app(tmp_path, None)
    _publish(given)
    # When
    app.run(transport=given, burst=True, max_seconds=30)
    app.close()
    # Then it starts (no "no transport configured") and the receipt goes there
    assert app.pipeline().counts
    assert receipt_topic("orders") in given.sent


def test_redis_down_at_start_leaves_the_pipelines_store_degraded(tmp_path: Any) -> None:
    # Given
    app = _app(tmp_path, MemoryTransport())
    # When
    app.check()
    # Then the store the pipeline claims with is the one the check degraded
    redis = app.pipeline().redis
    assert redis is not None and redis.degraded
    app.close()


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/staging",   # a path meant as a namespace
    "redis://127.0.0.1:6379/db1",       # a database written as a name
    "rediss://cache:6380/1x",           # a typo
    "redis://:p@ss/w@127.0.0.1:6379/1",  # a raw @ in the password: host "ss", path "/w@..."
])
def test_a_redis_url_whose_path_is_no_database_number_is_refused(url: str) -> None:
    # When / Then: redis-py reads such a path as no database at all, and connects to 0
    with pytest.raises(ConfigError, match="database number") as err:
        ConsumerApp(group="wiring", db="sqlite://", redis=url)
    assert "p@ss" not in str(err.value) and "ss/w" not in str(err.value)


@pytest.mark.parametrize(("url", "db"), [
    ("redis://127.0.0.1:6379/2", 2), ("redis://127.0.0.1:6379", 0),
    ("redis://127.0.0.1:6379/", 0), ("rediss://:p%40ss@cache:6380/3", 3),
    ("redis://127.0.0.1:6379/0?db=5", 5), ("redis://127.0.0.1/?db=4", 4),
    ("unix:///run/redis.sock?db=6", 6), ("unix:///run/redis.sock", 0),
])
def test_redis_urls_naming_their_database_are_accepted(url: str, db: int) -> None:
    app = ConsumerApp(group="wiring", db="sqlite://", redis=url)
    client = app._redis_client()
    assert client is not None
    assert client.connection_pool.connection_kwargs.get("db", 0) == db


def test_an_asyncio_redis_client_is_refused_when_the_app_is_made() -> None:
    # Given a client whose calls return coroutines: its PING at start "answered" (a coroutine
    # never awaited), then every claim failed and every message went back to the broker
    import redis.asyncio

    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0")
    # When / Then
    with pytest.raises(ConfigError, match="redis="):
        ConsumerApp(group="wiring", db="sqlite://", redis=client)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, 6379, b"redis://127.0.0.1:6379/0"])
def test_a_redis_option_that_is_neither_url_client_nor_none_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="redis="):
        ConsumerApp(group="wiring", db="sqlite://", redis=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("group", [b"inventory", "inventory\n", " inventory", 7])
def test_a_group_that_is_not_plain_text_is_refused(group: object) -> None:
    # bytes: its Redis keys read "{b'inventory'}" and every receipt failed after the handler
    # committed (the message went back to the broker until its retries were spent); a newline
    # from an environment variable: the processed rows and Redis keys of a group the other
    # consumers of the same broker group never look at
    with pytest.raises(ConfigError, match="consumer group"):
        ConsumerApp(group=group, db="sqlite://")  # type: ignore[arg-type]


def _app_on(path: Any, client: Any, group: str = "wiring") -> ConsumerApp:
    engine = sa.create_engine(f"sqlite:///{path}")
    processed_table(sa.MetaData(), "ckit_processed").create(engine, checkfirst=True)
    app = ConsumerApp(group=group, db=engine, redis=client, transport=MemoryTransport(),
                      receipts=None)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        pass

    return app


def test_a_group_whose_redis_keys_another_database_uses_is_warned_about_at_start(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    # Given one Redis database, and the same group consumed into a staging and a production
    # database (a message one finishes is a duplicate to the other: acked, never run)
    client = fakeredis.FakeRedis()
    staging = _app_on(tmp_path / "staging.db", client)
    production = _app_on(tmp_path / "production.db", client)
    staging.check()
    assert "share" not in caplog.text
    # When
    production.check()
    # Then
    assert "staging.db" in caplog.text and "production.db" in caplog.text
    assert "redis://host:port/N" in caplog.text
    for app in (staging, production):
        app.close()


def test_consumers_of_one_group_and_one_database_start_without_that_warning(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    client = fakeredis.FakeRedis()
    first, second = (_app_on(tmp_path / "one.db", client) for _ in range(2))
    other_group = _app_on(tmp_path / "two.db", client, group="other")
    for app in (first, second, first, other_group):
        app.check()
    assert "share" not in caplog.text
    for app in (first, second, other_group):
        app.close()


def _identity(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        return store_identity(engine, "ckit_processed")
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", [pytest.param("mariadb", marks=pytest.mark.mariadb),
                                  pytest.param("postgresql", marks=pytest.mark.postgresql)])
def test_one_database_is_one_owner_by_any_address_and_two_are_two(
        kind: str, tmp_path: Path) -> None:
    one = _identity(database_url(kind, tmp_path))
    assert _identity(database_url(kind, tmp_path).replace("127.0.0.1", "localhost")) == one
    assert _identity(database_url(kind, tmp_path, second=True)) != one
    assert "ckit:" not in one and "@" not in one  # no user, no password


@pytest.mark.mariadb
def test_every_node_of_a_galera_cluster_is_one_owner() -> None:
    url1, url2 = services.mysql_galera_url(), services.mysql_galera_url2()
    services.require("mariadb galera", lambda: services.ping_mysql(url1))
    services.require("mariadb galera node 2", lambda: services.ping_mysql(url2))
    assert _identity(url1) == _identity(url2)
