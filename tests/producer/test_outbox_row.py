"""An outbox row as a claim reads it (`OutboxRow.from_row`, by position) and the message the broker
gets for it (`to_message`): the relay's per-row path, kept lean, must say the same as the named one.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from consumer_kit.core.clock import to_epoch_ms
from consumer_kit.core.envelope import (
    PROP_BIZ,
    PROP_ID,
    PROP_RESEND,
    PROP_SENT,
    PROP_SRC,
    to_message,
)
from consumer_kit.core.rows import READ_COLUMNS, OutboxRow
from consumer_kit.core.schema import outbox_table

CREATED = dt.datetime(2026, 11, 25, 6, 0, 0, 123_999)


def values(**changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": 7, "message_id": "01JDQ0000000000000000000AA", "biz_type": "order", "biz_key": "42",
        "topic": "ORDER_CREATED", "tags": "created", "keys": "k1 01JDQ0000000000000000000AA k2",
        "headers": {"tenant": "t1"}, "body": b'{"order_id":42}', "retry_count": 0,
        "max_retries": 10, "created_by": "orders", "gmt_create": CREATED, "lock_version": 3,
        "state": 1, "sent_at": None}
    row.update(changes)
    return row


def test_read_columns_are_columns_of_the_outbox_table() -> None:
    table = outbox_table(sa.MetaData())
    assert all(name in table.c for name in READ_COLUMNS)


def test_from_row_builds_the_row_from_mapping_builds() -> None:
    for changes in ({}, {"sent_at": CREATED}, {"retry_count": 2}, {"tags": None, "keys": None,
                                                                      "headers": None}):
        named = values(**changes)
        by_position = OutboxRow.from_row(tuple(named[c] for c in READ_COLUMNS))
        assert by_position == OutboxRow.from_mapping(named)


def test_from_row_marks_a_row_that_went_out_before_as_a_resend() -> None:
    def row(**changes: object) -> OutboxRow:
        named = values(**changes)
        return OutboxRow.from_row(tuple(named[c] for c in READ_COLUMNS))

    assert not row().sent_before
    assert row(sent_at=CREATED).sent_before  # marked SENT once
    assert row(retry_count=1).sent_before  # a timed-out attempt may have reached the broker


def test_from_row_copies_a_driver_buffer_body_to_bytes() -> None:
    named = values(body=memoryview(b"abc"))
    assert OutboxRow.from_row(tuple(named[c] for c in READ_COLUMNS)).body == b"abc"


def test_to_message_puts_the_envelope_over_user_headers_and_the_id_first_in_keys() -> None:
    named = values(headers={"tenant": "t1", PROP_ID: "forged"}, sent_at=CREATED)
    message = to_message(OutboxRow.from_row(tuple(named[c] for c in READ_COLUMNS)))
    assert message.keys == ("01JDQ0000000000000000000AA", "k1", "k2")
    assert message.properties == {
        "tenant": "t1", PROP_ID: "01JDQ0000000000000000000AA", PROP_BIZ: "order:42",
        PROP_SRC: "orders", PROP_SENT: str(to_epoch_ms(CREATED)), PROP_RESEND: "1"}
    assert (message.topic, message.tags, message.sharding_key) == ("ORDER_CREATED", "created",
                                                                   "42")


def test_to_message_without_headers_keys_or_tags() -> None:
    named = values(headers=None, keys=None, tags=None)
    message = to_message(OutboxRow.from_row(tuple(named[c] for c in READ_COLUMNS)))
    assert message.keys == ("01JDQ0000000000000000000AA",)
    assert message.tags is None
    assert PROP_RESEND not in message.properties


def test_to_epoch_ms_counts_whole_milliseconds_since_the_epoch() -> None:
    assert to_epoch_ms(dt.datetime(1970, 1, 1)) == 0
    assert to_epoch_ms(CREATED) == 1_795_586_400_123  # 123.999 ms rounds down
    assert to_epoch_ms(dt.datetime(1969, 12, 31, 23, 59, 59, 999_500)) == -1


def test_to_epoch_ms_reads_an_aware_datetime_in_its_own_zone() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert to_epoch_ms(CREATED.replace(tzinfo=dt.timezone.utc)) == to_epoch_ms(CREATED)
    assert to_epoch_ms((CREATED + dt.timedelta(hours=2)).replace(tzinfo=plus_two)) == (
        to_epoch_ms(CREATED))
