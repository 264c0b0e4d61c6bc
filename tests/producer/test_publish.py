"""Outbox.publish: joins the caller's transaction, dedupes on the business key, no I/O."""

from __future__ import annotations

import dataclasses
import json

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.errors import PayloadError
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox
from tests.conftest import Db
from tests.recording import RecordingTransport


def outbox_rows(db: Db) -> list[sa.Row[tuple[str, int, bytes]]]:
    with db.engine.connect() as conn:
        return list(conn.execute(sa.text(
            f"SELECT message_id, state, body FROM {db.names.outbox} ORDER BY id")).all())


def test_publish_writes_a_pending_row_in_the_callers_transaction(db: Db) -> None:
    # Given
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    # When
    with db.engine.begin() as conn:
        mid = outbox.publish(conn, "ORDER_CREATED", {"order_id": 7}, biz_type="order",
                             biz_key="7", tags="created", keys=["o-7"], headers={"tenant": "a"})
    # Then
    rows = outbox_rows(db)
    assert [(r[0], r[1]) for r in rows] == [(mid, int(OutboxState.PENDING))]
    assert json.loads(rows[0][2]) == {"order_id": 7}


def test_a_rolled_back_transaction_leaves_no_row(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.connect() as conn:
        trans = conn.begin()
        outbox.publish(conn, "T", {"x": 1}, biz_type="order", biz_key="1")
        trans.rollback()
    assert outbox_rows(db) == []


def test_publishing_the_same_business_key_twice_returns_the_first_id(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        first = outbox.publish(conn, "T", {"v": 1}, biz_type="order", biz_key="42")
    with db.engine.begin() as conn:
        second = outbox.publish(conn, "T", {"v": 2}, biz_type="order", biz_key="42")
    assert first == second
    assert len(outbox_rows(db)) == 1


def test_publishing_a_new_message_is_one_insert_and_no_look_up(db: Db) -> None:
    # Given
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        if db.names.outbox in statement:
            statements.append(statement.split()[0].upper())

    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        # When
        with db.engine.begin() as conn:
            outbox.publish(conn, "T", {"v": 1}, biz_type="order", biz_key="1")
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)
    # Then the unique index, not a SELECT first, guards the business key
    assert statements == ["INSERT"]


def test_a_duplicate_in_the_same_transaction_keeps_the_transaction_usable(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        first = outbox.publish(conn, "T", {"v": 1}, biz_type="order", biz_key="42")
        again = outbox.publish(conn, "T", {"v": 2}, biz_type="order", biz_key="42")
        other = outbox.publish(conn, "T", {"v": 3}, biz_type="order", biz_key="43")
    assert again == first and other != first
    assert [r[0] for r in outbox_rows(db)] == [first, other]


def test_a_duplicate_through_a_session_commits_the_business_change(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with Session(db.engine) as session, session.begin():
        first = outbox.publish(session, "T", {"v": 1}, biz_type="order", biz_key="42")
    with Session(db.engine) as session, session.begin():
        again = outbox.publish(session, "T", {"v": 2}, biz_type="order", biz_key="42")
        other = outbox.publish(session, "T", {"v": 3}, biz_type="order", biz_key="43")
    assert again == first
    assert [r[0] for r in outbox_rows(db)] == [first, other]


def test_a_duplicate_committed_after_the_callers_snapshot_returns_its_id(server_db: Db) -> None:
    # Given a caller whose snapshot (MariaDB: REPEATABLE READ, PostgreSQL: READ COMMITTED)
    # predates a concurrent publish of the same key
    outbox = Outbox(server_db.engine, producer="orders", table=server_db.names.outbox)
    with server_db.engine.connect() as caller:
        caller.begin()
        caller.execute(sa.text(f"SELECT COUNT(*) FROM {server_db.names.outbox}")).scalar()
        with server_db.engine.begin() as other:
            theirs = outbox.publish(other, "T", {"v": 1}, biz_type="order", biz_key="42")
        # When the caller publishes the same business key
        mine = outbox.publish(caller, "T", {"v": 2}, biz_type="order", biz_key="42")
        caller.commit()
    # Then it gets the committed message id, not an IntegrityError
    assert mine == theirs
    assert len(outbox_rows(server_db)) == 1


def test_same_biz_key_under_another_biz_type_is_another_message(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        a = outbox.publish(conn, "T", {}, biz_type="order", biz_key="1")
        b = outbox.publish(conn, "T", {}, biz_type="refund", biz_key="1")
    assert a != b


@dataclasses.dataclass
class OrderCreated:
    order_id: int
    sku: str


@pytest.mark.parametrize(("payload", "body"), [
    ({"a": [1, 2]}, b'{"a":[1,2]}'),
    ([1, "x"], b'[1,"x"]'),
    ("plain text", b"plain text"),
    (b"raw-bytes", b"raw-bytes"),
    (OrderCreated(3, "SKU-1"), b'{"order_id":3,"sku":"SKU-1"}'),
])
def test_payload_kinds_are_encoded_to_body_bytes(sqlite_db: Db, payload: object,
                                                 body: bytes) -> None:
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    with sqlite_db.engine.begin() as conn:
        outbox.publish(conn, "T", payload, biz_type="t", biz_key="k")
    assert bytes(outbox_rows(sqlite_db)[0][2]) == body


def test_binary_payload_is_kept_byte_for_byte_up_to_the_transport(sqlite_db: Db) -> None:
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    transport = RecordingTransport()
    with sqlite_db.engine.begin() as conn:
        outbox.publish(conn, "T", b"\x00\xff\x01", biz_type="t", biz_key="k")
    from outbox_producer import Relay

    Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox).run_once()
    sent = transport.sent[0]
    assert sent.body == b"\x00\xff\x01"
    assert "ckit_enc" not in sent.properties  # wire encoding is the transport's business


def test_a_non_serializable_payload_fails_inside_publish_and_writes_nothing(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with pytest.raises(PayloadError, match="not serializable"), db.engine.begin() as conn:
        outbox.publish(conn, "T", {"when": object()}, biz_type="t", biz_key="1")
    assert outbox_rows(db) == []


def test_a_biz_key_longer_than_the_column_is_refused_with_its_length(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    too_long = "biz_key is 200 characters; the column holds 128"
    with pytest.raises(PayloadError, match=too_long), db.engine.begin() as conn:
        outbox.publish(conn, "T", {}, biz_type="t", biz_key="k" * 200)


def test_publish_with_a_session_joins_the_session_transaction(db: Db) -> None:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with Session(db.engine) as session:
        with session.begin():
            outbox.publish(session, "T", {"x": 1}, biz_type="t", biz_key="1")
            session.rollback()
        with session.begin():
            outbox.publish(session, "T", {"x": 2}, biz_type="t", biz_key="2")
    assert len(outbox_rows(db)) == 1


def test_publish_refuses_something_that_is_not_a_connection_or_session(sqlite_db: Db) -> None:
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    with pytest.raises(PayloadError, match="Connection or Session"):
        outbox.publish(sqlite_db.engine, "T", {}, biz_type="t", biz_key="1")  # type: ignore[arg-type]
