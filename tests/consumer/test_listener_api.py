"""The listener decorator: with and without arguments, checked at decoration time."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_kit import ConfigError, ConsumerApp, Message
from consumer_kit.core.errors import HandlerSignatureError, SchemaError
from consumer_kit.transports import Subscription


def make_app(**kwargs: Any) -> ConsumerApp:
    return ConsumerApp(group="inventory", db="sqlite://", transport="memory://api", **kwargs)


def test_the_decorator_works_bare_and_keeps_the_function_callable() -> None:
    app = make_app()

    @app.listener
    def order_created(msg: Message) -> str:
        return "called"

    assert order_created(None) == "called"  # type: ignore[arg-type]
    assert app.router.subscriptions() == [Subscription("ORDER_CREATED", "*")]


def test_the_decorator_takes_topic_and_tags() -> None:
    app = make_app()

    @app.listener("ORDERS", tags="created || paid")
    def handle(msg: Message, session: Any) -> None:
        pass

    [listener] = app.router.listeners
    assert (listener.topic, listener.tags, listener.wants_session) == (
        "ORDERS", "created || paid", True)


def test_unknown_options_are_refused_at_decoration_time() -> None:
    app = make_app()
    with pytest.raises(ConfigError, match=r"unknown listener option.*retries"):
        @app.listener("ORDERS", retries=3)
        def handle(msg: Message) -> None:
            pass


@pytest.mark.parametrize("bad", [
    lambda: None,
    lambda msg, session, extra: None,
    lambda msg, *, required: None,
    lambda msg, session=None: None,
])
def test_a_handler_with_a_wrong_signature_is_refused(bad: Any) -> None:
    app = make_app()
    with pytest.raises(HandlerSignatureError, match=r"must take \(msg\) or \(msg, session\)"):
        app.listener("ORDERS")(bad)


def test_two_listeners_for_the_same_topic_and_tags_are_refused() -> None:
    app = make_app()
    app.listener("ORDERS")(lambda msg: None)
    with pytest.raises(ConfigError, match="already has listener"):
        app.listener("ORDERS")(lambda msg: None)


def test_start_up_check_names_a_missing_processed_table() -> None:
    app = make_app()
    app.listener("ORDERS")(lambda msg: None)
    with pytest.raises(SchemaError, match="ckit db init"):
        app.check()


def test_redis_down_at_start_degrades_to_the_database_path_without_its_password(
        caplog: pytest.LogCaptureFixture) -> None:
    # Given an app whose Redis does not answer
    app = make_app(redis="redis://:SECRET@127.0.0.1:1/0")
    app.listener("ORDERS")(lambda msg: None)
    import sqlalchemy as sa

    from consumer_kit.core.schema import processed_table
    from consumer_kit.metrics import DEGRADED

    processed_table(sa.MetaData()).create(app.engine)
    try:
        # When it starts
        app.check()
        # Then it starts on the database path: a warning naming Redis (no password), the gauge
        # up
        pipeline_redis = app.pipeline().redis
        assert pipeline_redis is not None and pipeline_redis.degraded
        assert DEGRADED.labels(app.group)._value.get() == 1
        assert "unreachable at start" in caplog.text and "SECRET" not in caplog.text
    finally:
        app.close()


def test_an_app_without_listeners_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match="no listeners"):
        make_app().check()


def test_message_json_and_envelope_fields() -> None:
    from consumer_kit.transports import Delivery

    msg = Message.from_delivery(Delivery(
        topic="T", body=b'{"a": 1}', broker_message_id="B1", tags="x", keys="k1 k2",
        properties={"ckit_id": "M", "ckit_src": "orders", "ckit_biz": "order:1",
                    "ckit_sent": "1700000000000"}, reconsume_times=2))
    assert (msg.id, msg.producer, msg.biz, msg.sent_at_ms) == ("M", "orders", "order:1",
                                                               1700000000000)
    assert msg.json() == {"a": 1} and msg.keys == ("k1", "k2") and msg.reconsume_times == 2


def test_start_up_check_names_an_unreachable_database_without_its_password() -> None:
    from consumer_kit.core.errors import DatabaseUnavailable

    app = ConsumerApp(group="inventory", db="mysql+pymysql://app:SECRET@127.0.0.1:1/orders",
                      transport="memory://")
    app.listener("ORDERS")(lambda msg: None)
    with pytest.raises(DatabaseUnavailable, match="unreachable") as caught:
        app.check()
    assert "SECRET" not in str(caught.value)


@pytest.mark.parametrize(("options", "named"), [
    ({"dedupe_key": "order_id"}, "dedupe_key"),  # a field name where a function belongs
    ({"dedupe_key": 123}, "dedupe_key"),
    ({"permanent": ("ValueError",)}, "permanent"),  # names, not classes
    ({"permanent": (ValueError, 3)}, "permanent"),
    ({"permanent": "ValueError"}, "permanent"),
    ({"tags": 123}, "tags"),
    ({"tags": ["a", "b"]}, "tags"),
])
def test_listener_options_that_could_never_work_are_refused_at_decoration_time(
        options: dict[str, Any], named: str) -> None:
    # (a wrong dedupe_key would reject every message without a ckit_id; a permanent entry
    # that is not a class would break every failing message)
    app = make_app()
    with pytest.raises(ConfigError, match=named):
        app.listener("ORDER_CREATED", **options)(lambda msg: None)
    assert app.router.listeners == []


@pytest.mark.parametrize("tags", ["created || *", "* || *", " || "])
def test_a_tag_expression_mixing_star_with_tags_or_naming_none_is_refused_in_one_line(
        tags: str) -> None:
    # Given a tag expression the subscription would read as "every tag" (or name no tag)
    # while the router matched it tag by tag: every message of another tag was delivered, found
    # no listener and was rejected
    app = make_app()

    # When it is declared, then it is refused, naming it, before any message moves
    with pytest.raises(ConfigError, match="tags") as caught:
        app.listener("ORDER_CREATED", tags=tags)(lambda msg: None)
    assert "\n" not in str(caught.value)
    assert app.router.listeners == []


@pytest.mark.parametrize("tags", ["*", " * ", "", "created", "created || paid", "created ||"])
def test_a_tag_expression_of_star_alone_or_of_tags_is_taken(tags: str) -> None:
    app = make_app()
    app.listener("ORDER_CREATED", tags=tags)(lambda msg: None)
    assert len(app.router.listeners) == 1


def test_one_exception_class_is_taken_as_permanent() -> None:
    app = make_app()
    app.listener("ORDER_CREATED", permanent=KeyError)(lambda msg: None)
    assert app.router.listeners[0].permanent == (KeyError,)


@pytest.mark.parametrize(("options", "named"), [
    ({"permanent_errors": ("ValueError",)}, "permanent_errors"),
    ({"lease": __import__("datetime").timedelta(0)}, "lease"),
    ({"lease": __import__("datetime").timedelta(microseconds=400)}, "lease"),
    ({"done_ttl": __import__("datetime").timedelta(seconds=-1)}, "done_ttl"),
    ({"done_ttl": 3600}, "done_ttl"),  # seconds where a timedelta belongs
    ({"threads": 0}, "threads"),
    ({"local_cache": -1}, "local_cache"),
])
def test_app_options_that_could_never_work_are_refused_when_it_is_made(
        options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        make_app(**options)
