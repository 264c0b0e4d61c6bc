"""Bad input on the `rocketmq5://` transport: one clear line each, nothing lost, and nothing marked
SENT that the broker did not take (the relay's outbox rows are checked on a SQLite database).

Cases: the proxy down, an endpoint that is not a gRPC proxy, a topic that does not exist, a FIFO
group on a normal topic, a body over the limit, a wrong scheme; plus the 5.x message-type rules
(a FIFO topic sent to unordered, a delay on a FIFO topic).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from consumer_kit import ConsumerApp
from consumer_kit.core.errors import (
    CkitError,
    ConfigError,
    MessageTooLarge,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.messages import dlq_topic
from consumer_kit.core.states import OutboxState
from consumer_kit.testing.harness import unique, wait_for
from consumer_kit.transports import (
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
    open_transport,
)
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from outbox_producer import Outbox, Relay
from tests import services
from tests.conftest import Db
from tests.harnesses.rocketmq5 import transport as make_transport

pytestmark = [pytest.mark.rocketmq5]


@pytest.fixture(autouse=True)
def _rocketmq5() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)


@pytest.fixture
def t() -> Iterator[RocketMQ5Transport]:
    transport = make_transport()
    yield transport
    transport.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line(exc: pytest.ExceptionInfo[CkitError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def relay_one(db: Db, transport: RocketMQ5Transport, topic: str,
              payload: object, *, max_body_bytes: int | None = None) -> tuple[int, str | None, int]:
    """Publish one message to `topic` (through an outbox told `max_body_bytes`, when given) and
    run the relay once (stopped after 5 s: it waits out a broker outage): (state, fail_reason,
    retries)."""
    limit = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, **limit)
    with db.engine.begin() as conn:
        mid = outbox.publish(conn, topic, payload, biz_type="t", biz_key=unique("k"))
    relay = Relay(db.engine, transport, table=db.names.outbox, owner="relay-bad-input")
    timer = threading.Timer(5.0, relay.stop)
    timer.start()
    try:
        relay.run_once()
    finally:
        timer.cancel()
    with db.engine.connect() as conn:
        row = conn.execute(sa.text(f"SELECT state, fail_reason, retry_count FROM "
                                   f"{db.names.outbox} WHERE message_id = :m"), {"m": mid}).one()
    return int(row[0]), row[1], int(row[2])


def test_a_proxy_that_is_down_is_one_line_and_the_row_stays_pending(sqlite_db: Db) -> None:
    # Given
    down = RocketMQ5Transport(f"rocketmq5://127.0.0.1:{closed_port()}")
    try:
        # When
        with pytest.raises(TransportUnavailable) as exc:
            down.send(OutgoingMessage("ckit_smoke", b"{}"))
        state, _reason, retries = relay_one(sqlite_db, down, "ckit_smoke", {"n": 1})
        # Then
        assert "is unreachable" in one_line(exc)
        assert state == int(OutboxState.PENDING) and retries == 0  # an outage costs no retry
        with pytest.raises(TransportUnavailable, match="is unreachable"):
            down.consumer("ckit_smoke_group", [Subscription("ckit_smoke")],
                          lambda _d: ConsumeStatus.CONSUME_SUCCESS).start()
    finally:
        down.close()


@pytest.mark.parametrize("port", ["namesrv", "broker"])
def test_an_endpoint_that_is_not_a_grpc_proxy_says_where_to_point_it(port: str) -> None:
    addr = services.rocketmq5_namesrv_addr() if port == "namesrv" else "127.0.0.1:10951"
    wrong = RocketMQ5Transport(f"rocketmq5://{addr}")
    try:
        with pytest.raises(TransportError) as exc:
            wrong.send(OutgoingMessage("ckit_smoke", b"{}"))
        assert "is not a RocketMQ 5 gRPC proxy" in one_line(exc)
        assert "rocketmq://" in str(exc.value)
        with pytest.raises(ConfigError, match="not a RocketMQ 5 gRPC proxy"):
            wrong.consumer("ckit_smoke_group", [Subscription("ckit_smoke")],
                           lambda _d: ConsumeStatus.CONSUME_SUCCESS).start()
    finally:
        wrong.close()


def test_a_topic_that_does_not_exist_is_one_line_and_the_row_is_not_sent(
    t: RocketMQ5Transport, sqlite_db: Db
) -> None:
    missing = unique("no_such_topic")
    with pytest.raises(TransportError) as exc:
        t.send(OutgoingMessage(missing, b"{}"))
    assert f"topic {missing} does not exist" in one_line(exc)
    state, reason, retries = relay_one(sqlite_db, t, missing, {"n": 1})
    assert state == int(OutboxState.PENDING) and retries == 1  # retried later, with the reason
    assert reason is not None and "does not exist" in reason
    with pytest.raises(TransportError, match="does not exist"):
        t.consumer("ckit_smoke_group", [Subscription(missing)],
                   lambda _d: ConsumeStatus.CONSUME_SUCCESS).start()


def test_a_fifo_group_on_a_normal_topic_is_refused_and_its_messages_stay_for_a_normal_group(
    t: RocketMQ5Transport,
) -> None:
    # Given: a NORMAL topic, a FIFO group and a normal group
    assert t.admin is not None
    topic, fifo_group, group = unique("bad_fifo"), unique("g_fifo"), unique("g_normal")
    t.admin.create_typed_topic(topic, message_type="NORMAL")
    t.admin.update_group(fifo_group, retry_max_times=2, fifo=True)
    # When
    with pytest.raises(TransportError) as exc:
        t.consumer(fifo_group, [Subscription(topic)],
                   lambda _d: ConsumeStatus.CONSUME_SUCCESS).start()
    # Then
    assert f"{fifo_group} is a FIFO group but topic {topic} is NORMAL" in one_line(exc)
    got: list[Delivery] = []
    consumer = t.consumer(group, [Subscription(topic)],
                          lambda d: (got.append(d), ConsumeStatus.CONSUME_SUCCESS)[1])
    consumer.start()
    try:
        t.send(OutgoingMessage(topic, b"kept"))
        assert wait_for(lambda: [d.body for d in got] == [b"kept"], 30)
    finally:
        consumer.shutdown()


def test_a_body_over_the_limit_is_refused_before_sending_and_the_row_fails(
    t: RocketMQ5Transport, sqlite_db: Db
) -> None:
    with pytest.raises(MessageTooLarge) as exc:
        t.send(OutgoingMessage("ckit_smoke", b"x" * (t.max_body_bytes + 1)))
    assert "exceeds the limit" in one_line(exc)
    # (stored through an outbox told a larger limit than this transport's: the relay's check)
    state, reason, _ = relay_one(sqlite_db, t, "ckit_smoke", {"x": "y" * t.max_body_bytes},
                                 max_body_bytes=8 << 20)
    assert state == int(OutboxState.FAILED)  # retrying cannot help
    assert reason is not None and "exceeds the limit" in reason


def test_the_proxy_refuses_a_body_over_its_own_limit_even_when_the_transport_allows_it() -> None:
    lax = make_transport(max_body_bytes=8 * 1024 * 1024)
    try:
        with pytest.raises(MessageTooLarge):
            lax.send(OutgoingMessage("ckit_smoke", b"x" * (4 * 1024 * 1024 + 1)))
    finally:
        lax.close()


@pytest.mark.parametrize("url", [
    "rocketmq5+grpc://127.0.0.1:8081", "http://127.0.0.1:8081", "rocketmq5://127.0.0.1",
    "rocketmq5://127.0.0.1:8081?token=x",
])
def test_a_wrong_endpoint_scheme_or_address_is_one_config_line(url: str) -> None:
    with pytest.raises(ConfigError) as exc:
        open_transport(url)
    assert one_line(exc)  # type: ignore[arg-type]


def test_a_rocketmq_url_given_to_the_5x_transport_says_which_is_which() -> None:
    with pytest.raises(ConfigError, match="a name server is rocketmq://"):
        RocketMQ5Transport("rocketmq://127.0.0.1:9876")


def test_a_fifo_topic_sent_unordered_and_a_delayed_fifo_message_are_refused(
    t: RocketMQ5Transport,
) -> None:
    with pytest.raises(TransportError) as exc:
        t.send(OutgoingMessage("ckit_smoke_fifo", b"{}"))
    assert "list it in ordered_topics" in one_line(exc)
    ordered = make_transport(ordered_topics=["ckit_smoke_fifo"])
    try:
        with pytest.raises(TransportError, match="cannot delay a FIFO message"):
            ordered.send(OutgoingMessage("ckit_smoke_fifo", b"{}", delay=5))
        with pytest.raises(TransportError, match="refuses a DELAY message"):
            ordered.send(OutgoingMessage("ckit_smoke", b"{}", delay=5))
    finally:
        ordered.close()


def test_an_empty_body_or_a_reserved_property_is_refused_before_sending(
    t: RocketMQ5Transport,
) -> None:
    with pytest.raises(TransportError, match="refuses an empty body"):
        t.send(OutgoingMessage("ckit_smoke", b""))
    with pytest.raises(TransportError, match="reserved by RocketMQ"):
        t.send(OutgoingMessage("ckit_smoke", b"{}", properties={"UNIQ_KEY": "x"}))


def test_an_app_on_a_topic_that_does_not_exist_fails_without_creating_it(
    t: RocketMQ5Transport, sqlite_db: Db
) -> None:
    # Given: a transport with the name server but without create_topics, a missing topic
    assert t.admin is not None and not t.create_topics
    missing, group = unique("app_no_such_topic"), unique("g_app_missing")
    app = ConsumerApp(group=group, db=sqlite_db.engine, redis=None, receipts=None,
                      processed_table=sqlite_db.names.processed, transport=t)
    app.listener(missing)(lambda msg, session: None)
    # When
    try:
        with pytest.raises(TransportError) as exc:
            app.run(max_seconds=3)
    finally:
        app.close()
    # Then: the error says to create it, and it was not created
    assert f"topic {missing} does not exist" in one_line(exc)
    assert "create it first" in one_line(exc)
    assert t.admin.topic_route(missing) is None


def test_a_name_server_of_another_cluster_is_refused_before_anything_is_written_to_it(
        t: RocketMQ5Transport) -> None:
    services.require("rocketmq", services.ping_rocketmq)
    # Given: a topic on the proxy's cluster, and a transport whose name server is the 4.x one
    assert t.admin is not None
    topic, group = unique("wrong_namesrv"), unique("g_wrong_namesrv")
    t.admin.create_typed_topic(topic, message_type="NORMAL")
    other = services.rocketmq_addr()
    wrong = RocketMQ5Transport(t.endpoint, namesrv=other, max_reconsume_times=1)
    consumer = wrong.consumer(group, [Subscription(topic)],
                              lambda _d: ConsumeStatus.CONSUME_SUCCESS)
    try:
        # When / Then: the name server does not route the proxy's topic: one line
        with pytest.raises(TransportError) as exc:
            consumer.start()
    finally:
        consumer.shutdown()
        wrong.close()
    assert (f"topic {topic} is on the cluster behind the RocketMQ 5 proxy at {t.endpoint} "
            f"(brokers broker5-a), but the name server {other} has no route for it") \
        in one_line(exc)
    # and the other cluster got neither the group (it used to get it, with its retry limit,
    # before the start compared what the proxy reported) nor its dead-letter topic
    other_admin = RocketMQAdmin(other)
    assert all(group not in other_admin.subscription_groups(addr)
               for addr in other_admin.master_brokers().values())
    assert other_admin.topic_route(dlq_topic(group)) is None
