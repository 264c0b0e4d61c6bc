"""Nothing is silently dropped at publish: what cannot be sent fails inside `publish`, where the
business transaction can still roll back, and writes nothing (issue 11, class 2)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.errors import ConfigError, PayloadError, PublishConflict
from consumer_kit.core.schema import BIZ_KEY_LEN
from consumer_kit.transports.memory import MemoryTransport
from consumer_kit.transports.rocketmq.wire import DEFAULT_ROCKETMQ_MAX_BODY_BYTES
from outbox_producer import Dispatcher, Outbox
from tests.conftest import Db


def row_count(db: Db) -> int:
    return db.count(db.names.outbox)


def outbox(db: Db, **kwargs: object) -> Outbox:
    return Outbox(db.engine, producer="orders", table=db.names.outbox, **kwargs)  # type: ignore[arg-type]


# -- the business key ----------------------------------------------------------------------------


def test_the_same_business_key_for_another_topic_raises_a_conflict_naming_the_first(
        db: Db) -> None:
    # Given order 42 published on ORDER_CREATED
    box = outbox(db)
    with db.engine.begin() as conn:
        first = box.publish(conn, "ORDER_CREATED", {"v": 1}, biz_type="order", biz_key="42")
    # When the same business key is published for another topic
    with pytest.raises(PublishConflict) as raised, db.engine.begin() as conn:
        box.publish(conn, "ORDER_PAID", {"v": 2}, biz_type="order", biz_key="42")
    # Then the error names the existing message and its topic, and nothing was written
    assert first in str(raised.value) and "'ORDER_CREATED'" in str(raised.value)
    assert row_count(db) == 1


def test_a_conflict_leaves_the_callers_transaction_usable(db: Db) -> None:
    box = outbox(db)
    with Session(db.engine) as session, session.begin():
        box.publish(session, "A", {}, biz_type="order", biz_key="1")
        with pytest.raises(PublishConflict):
            box.publish(session, "B", {}, biz_type="order", biz_key="1")
        other = box.publish(session, "A", {}, biz_type="order", biz_key="2")
    assert other and row_count(db) == 2


def test_the_same_business_key_for_the_same_topic_still_returns_the_first_id(db: Db) -> None:
    box = outbox(db)
    with db.engine.begin() as conn:
        first = box.publish(conn, "T", {"v": 1}, biz_type="order", biz_key="42")
        again = box.publish(conn, "T", {"v": 2}, biz_type="order", biz_key="42")
    assert again == first and row_count(db) == 1


# -- the size limit ------------------------------------------------------------------------------


def test_a_payload_over_the_dispatchers_transport_limit_is_refused_inside_publish(
        db: Db) -> None:
    # Given an outbox whose dispatcher sends through a transport taking 100-byte bodies
    dispatcher = Dispatcher(db.engine, MemoryTransport(max_body_bytes=100),
                            table=db.names.outbox)
    box = outbox(db, dispatcher=dispatcher)
    assert box.max_body_bytes == 100
    # When / Then: 101 bytes fail in publish and the business change rolls back with them
    with pytest.raises(PayloadError, match=r"101 bytes exceeds .* limit of 100"), \
            Session(db.engine) as session, session.begin():
        box.publish(session, "T", "x" * 101, biz_type="t", biz_key="big")
    with db.engine.begin() as conn:
        box.publish(conn, "T", "x" * 100, biz_type="t", biz_key="fits")
    assert row_count(db) == 1


def test_without_a_dispatcher_the_limit_is_rocketmqs_or_the_one_given(sqlite_db: Db) -> None:
    assert outbox(sqlite_db).max_body_bytes == DEFAULT_ROCKETMQ_MAX_BODY_BYTES
    small = outbox(sqlite_db, max_body_bytes=10)
    with pytest.raises(PayloadError, match="limit of 10"), sqlite_db.engine.begin() as conn:
        small.publish(conn, "T", b"0123456789A", biz_type="t", biz_key="1")
    with pytest.raises(ConfigError, match="max_body_bytes"):
        outbox(sqlite_db, max_body_bytes=0)


def test_a_binary_body_counts_at_its_base64_size_for_rocketmq(sqlite_db: Db) -> None:
    # Given RocketMQ's rule (bodies that are not NUL-free UTF-8 travel as base64)
    box = outbox(sqlite_db, max_body_bytes=100)
    with sqlite_db.engine.begin() as conn:
        box.publish(conn, "T", b"a" * 100, biz_type="t", biz_key="text")  # UTF-8: as it is
    # When / Then: 90 binary bytes are 120 on the wire
    with pytest.raises(PayloadError, match=r"90 bytes \(120 as base64"), \
            sqlite_db.engine.begin() as conn:
        box.publish(conn, "T", b"\x00" * 90, biz_type="t", biz_key="binary")


@pytest.mark.parametrize("payload", ["", b""])
def test_an_empty_payload_is_refused_as_rocketmq_refuses_it(sqlite_db: Db, payload: object
                                                            ) -> None:
    # (the C++ client answers "the message body is empty", which reads as a broker outage)
    with pytest.raises(PayloadError, match="empty"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", payload, biz_type="t", biz_key="1")
    assert row_count(sqlite_db) == 0


# -- topics, tags, keys -------------------------------------------------------------------------


@pytest.mark.parametrize(("topic", "why"), [
    ("%RETRY%inventory", "reserved prefix '%RETRY%'"),
    ("%DLQ%inventory", "reserved prefix '%DLQ%'"),
    ("rmq_sys_x", "reserved prefix 'rmq_sys_'"),
    ("ckit-receipt-orders", "reserved prefix 'ckit-receipt-'"),
    ("SCHEDULE_TOPIC_XXXX", "system topic"),
    ("TBW102", "system topic"),
    ("order.created", "characters RocketMQ refuses"),
    ("order created", "characters RocketMQ refuses"),
    ("ordér", "characters RocketMQ refuses"),
    ("T" * 128, "RocketMQ allows at most 127"),
    ("", "non-empty"),
])
def test_a_topic_rocketmq_would_refuse_is_refused_at_publish(sqlite_db: Db, topic: str,
                                                             why: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(why)), \
            sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, topic, {}, biz_type="t", biz_key="1")
    assert row_count(sqlite_db) == 0


def test_topics_within_rocketmqs_rules_are_accepted(sqlite_db: Db) -> None:
    with sqlite_db.engine.begin() as conn:
        for n, topic in enumerate(("ORDER_CREATED", "order-created", "a|b", "T" * 127)):
            outbox(sqlite_db).publish(conn, topic, {}, biz_type="t", biz_key=str(n))
    assert row_count(sqlite_db) == 4


@pytest.mark.parametrize(("tags", "why"), [
    ("a||b", "'||'"), (" a", "whitespace"), ("a\x01", "control"), ("", "non-empty"),
])
def test_tags_a_subscription_could_not_select_are_refused(sqlite_db: Db, tags: str,
                                                          why: str) -> None:
    with pytest.raises(PayloadError, match=re.escape(why)), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1", tags=tags)


@pytest.mark.parametrize("keys", ["k 1", ["k1", "k 2"], ["k1", ""], ["a\tb"], [None]])
def test_keys_that_would_not_come_back_as_given_are_refused(sqlite_db: Db,
                                                            keys: object) -> None:
    with pytest.raises(PayloadError, match="key"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1",
                                  keys=keys)  # type: ignore[arg-type]
    assert row_count(sqlite_db) == 0


def test_several_keys_are_stored_space_separated(sqlite_db: Db) -> None:
    with sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1", keys=("k1", "k2"))
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="2", keys="k3")
    with sqlite_db.engine.connect() as conn:
        stored = conn.execute(sa.text(
            f"SELECT keys FROM {sqlite_db.names.outbox} ORDER BY id")).scalars().all()
    assert stored == ["k1 k2", "k3"]


# -- delay and headers ---------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, dt.timedelta(seconds=-5),
                                   "10s", True, 10**12])
def test_a_bad_delay_is_refused_naming_delay(sqlite_db: Db, delay: object) -> None:
    with pytest.raises(PayloadError, match="delay"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1",
                                  delay=delay)  # type: ignore[arg-type]
    assert row_count(sqlite_db) == 0


@pytest.mark.parametrize("name", ["ckit_id", "ckit_src", "ckit_enc", "ckit_reason",
                                  "ckit_future", "traceparent", "KEYS", "TAGS", "DELAY",
                                  "UNIQ_KEY", "TTL", "bad name", "a,b", ""])
def test_a_header_that_collides_with_the_envelope_or_rocketmq_is_refused(sqlite_db: Db,
                                                                         name: str) -> None:
    with pytest.raises(PayloadError, match="header"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1",
                                  headers={name: "x"})
    assert row_count(sqlite_db) == 0


@pytest.mark.parametrize("value", [None, 5, "a\x00b", "x" * 40_000])
def test_a_header_value_that_cannot_travel_is_refused(sqlite_db: Db, value: object) -> None:
    with pytest.raises(PayloadError, match="header"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1",
                                  headers={"tenant": value})  # type: ignore[dict-item]


def test_a_producer_name_that_cannot_name_its_receipt_topic_is_refused(sqlite_db: Db) -> None:
    for producer in ("order service", "", "p" * 120):
        with pytest.raises(ConfigError, match="producer"):
            Outbox(sqlite_db.engine, producer=producer)


def test_checking_a_message_adds_no_database_round_trip(sqlite_db: Db) -> None:
    # Given every optional field set
    box = outbox(sqlite_db)
    statements: list[str] = []

    def record(*args: object) -> None:
        statements.append(str(args[2]).split()[0].upper())

    sa.event.listen(sqlite_db.engine, "before_cursor_execute", record)
    try:
        # When
        with sqlite_db.engine.begin() as conn:
            box.publish(conn, "T", {"v": 1}, biz_type="t", biz_key="1", tags="a",
                        keys=["k1", "k2"], headers={"tenant": "x"}, delay=1.5)
    finally:
        sa.event.remove(sqlite_db.engine, "before_cursor_execute", record)
    # Then the INSERT is the only statement
    assert statements == ["INSERT"]


@pytest.mark.parametrize(("field", "value"), [
    ("biz_key", "a\x00b"), ("biz_key", "a\x01b"), ("biz_key", "a\x02b"), ("biz_key", ""),
    ("biz_key", "k" * 1000), ("biz_key", "k" * (BIZ_KEY_LEN + 1)), ("biz_key", 42),
    ("biz_key", b"bytes"), ("keys", "two words"), ("tags", "a||b"),
])
def test_a_topic_published_before_still_has_every_other_field_checked(
        db: Db, field: str, value: object) -> None:
    # Given: ORDER_CREATED / order published once (its topic and biz_type are remembered)
    box = outbox(db)
    with db.engine.begin() as conn:
        box.publish(conn, "ORDER_CREATED", {"v": 1}, biz_type="order", biz_key="first")
    # When: the next message of the same topic and biz_type has a bad field
    fields: dict[str, object] = {"biz_type": "order", "biz_key": "second"}
    fields[field] = value
    with pytest.raises(PayloadError, match=field), db.engine.begin() as conn:
        box.publish(conn, "ORDER_CREATED", {"v": 2}, **fields)  # type: ignore[arg-type]
    # Then: refused, nothing written
    assert row_count(db) == 1


class Key(str):
    """A str subclass, as some frameworks hand out (e.g. a lazily translated or marked string)."""


def test_a_known_topic_still_takes_any_biz_key_the_column_holds(sqlite_db: Db) -> None:
    box = outbox(sqlite_db)
    with sqlite_db.engine.begin() as conn:
        box.publish(conn, "ORDER_CREATED", {"v": 1}, biz_type="order", biz_key="first")
        box.publish(conn, "ORDER_CREATED", {"v": 2}, biz_type="order", biz_key="k" * BIZ_KEY_LEN)
        box.publish(conn, "ORDER_CREATED", {"v": 3}, biz_type="order", biz_key=Key("sub"))
    with sqlite_db.engine.connect() as conn:
        keys = conn.execute(sa.text(
            f"SELECT biz_key FROM {sqlite_db.names.outbox} ORDER BY id")).scalars().all()
    assert keys == ["first", "k" * BIZ_KEY_LEN, "sub"]


@pytest.mark.parametrize("extra", [{}, {"headers": {}}, {"delay": 0}, {"delay": 0.0},
                                   {"delay": dt.timedelta(0)}, {"delay": None, "headers": None}])
def test_no_delay_and_no_headers_in_any_form_store_the_same_row(sqlite_db: Db,
                                                                extra: dict[str, object]) -> None:
    with sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", {}, biz_type="t", biz_key="1",
                                  **extra)  # type: ignore[arg-type]
    with sqlite_db.engine.connect() as conn:
        row = conn.execute(sa.text(
            f"SELECT headers, next_retry_at, gmt_create FROM {sqlite_db.names.outbox}")).one()
    assert row.headers is None and row.next_retry_at == row.gmt_create


@pytest.mark.parametrize(("fields", "named"), [
    ({"headers": {"note": "caf\udce9"}}, "control characters"),  # a lone surrogate
    ({"headers": {"TIMER_DELAY_SEC": "25"}}, "keeps for itself"),  # a 5.x broker would delay
    ({"headers": {"__SHARDINGKEY": "x"}}, "keeps for itself"),
    ({"headers": {"h": ""}}, "empty value"),  # the 4.x client drops it
    ({"headers": {"h": "a\nb"}}, "control characters"),
    ({"headers": {f"h{i}": "v" for i in range(121)}}, "at most 120"),
    ({"headers": {f"h{i}": "v" * 200 for i in range(80)}}, "bytes"),
    ({"tags": "a|b"}, "'|'"),
    ({"tags": "a\tb"}, "control characters"),
    ({"keys": ["a\x07b"]}, "control characters"),
    ({"biz_key": "k\t1"}, "control characters"),
    ({"biz_key": "order-1 "}, "whitespace"),  # MariaDB's binary collation ignores it
    ({"biz_type": " order"}, "whitespace"),
    ({"payload": {1: "x", "1": "y"}}, "collide"),
    ({"payload": {"a": "\ud800"}}, "lone surrogate"),
])
def test_what_a_rocketmq_transport_would_refuse_or_alter_is_refused_at_publish(
        db: Db, fields: dict[str, object], named: str) -> None:
    # (each passed publish before, then failed at send on some transport, or reached the
    # handler changed: a header dropped, a delayed message, a key merged)
    call: dict[str, object] = {"payload": {"n": 1}, "biz_type": "t", "biz_key": "k1", **fields}
    payload = call.pop("payload")
    with pytest.raises(PayloadError, match=re.escape(named)), db.engine.begin() as conn:
        outbox(db).publish(conn, "T", payload, **call)  # type: ignore[arg-type]
    assert row_count(db) == 0


def test_max_retries_beyond_its_column_is_refused_when_the_outbox_is_made(db: Db) -> None:
    with pytest.raises(ConfigError, match="max_retries"):
        outbox(db, max_retries=2**31)


@dataclasses.dataclass
class _Lines:
    qty: dict[object, int]


@pytest.mark.parametrize("payload", [
    {"lines": ({1: 2, "1": 3},)},  # a tuple is a JSON array too
    _Lines({1: 2, "1": 3}),  # a dataclass is its fields' dict
    [_Lines({True: 2, "true": 3})],
    {"order": _Lines({None: 2, "null": 3})},
])
def test_keys_that_collide_in_json_are_refused_inside_tuples_and_dataclasses(
        sqlite_db: Db, payload: object) -> None:
    # (they were sent as {"1": 2, "1": 3}: the handler read {"1": 3}, a quantity lost)
    with pytest.raises(PayloadError, match="collide"), sqlite_db.engine.begin() as conn:
        outbox(sqlite_db).publish(conn, "T", payload, biz_type="t", biz_key="k1")
    assert row_count(sqlite_db) == 0
