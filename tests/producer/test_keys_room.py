"""KEYS that publish accepts must fit every transport beside the message id, and a stored row
whose KEYS a transport cannot hold is that row's failure, not the relay's: it used to be a
`ConfigError` from the SQL transport, which stopped the relay at that row on every run."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import PayloadError
from consumer_kit.core.schema import KEYS_LEN, outbox_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports import open_transport
from outbox_producer import Outbox, Relay
from tests.conftest import Db
from tests.producer.test_relay_partial import outbox_states, sql_transport

#: the length of every message id (a ULID)
ULID = "01M8JNFWV56HNT3GH1AMD9652F"


def test_keys_that_would_not_fit_beside_the_message_id_are_refused_at_publish(
        sqlite_db: Db) -> None:
    # Given keys that fit the outbox column but not with the message id in front of them
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    room = KEYS_LEN - len(ULID) - 1  # the message id and a space go first
    too_long = ["k" * (room + 1)]
    # When / Then
    with sqlite_db.engine.begin() as conn:
        with pytest.raises(PayloadError, match="fit beside the message id"):
            outbox.publish(conn, "T", {"v": 1}, biz_type="t", biz_key="1", keys=too_long)
        outbox.publish(conn, "T", {"v": 1}, biz_type="t", biz_key="2", keys=["k" * room])
    assert sqlite_db.count(sqlite_db.names.outbox) == 1


def test_a_row_whose_keys_the_sql_transport_cannot_hold_fails_alone_and_the_relay_goes_on(
        sqlite_db: Db, tmp_path: Path) -> None:
    # Given three rows, the middle one's KEYS filled to the column (as publish let through,
    # or a hand edit): with its message id in front they no longer fit the SQL transport's
    outbox = Outbox(sqlite_db.engine, producer="orders", table=sqlite_db.names.outbox)
    with sqlite_db.engine.begin() as conn:
        ids = [outbox.publish(conn, "T", {"v": i}, biz_type="t", biz_key=str(i))
               for i in range(3)]
        t = outbox_table(sa.MetaData(), sqlite_db.names.outbox)
        conn.execute(sa.update(t).where(t.c.message_id == ids[1]).values(keys="k" * KEYS_LEN))
    transport = open_transport(sql_transport(tmp_path))
    try:
        # When
        result = Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox).run_once()
    finally:
        transport.close()
    # Then the others are sent, and that row is FAILED with the reason, not retried forever
    states = outbox_states(sqlite_db.engine, sqlite_db.names.outbox)
    assert states == {ids[0]: OutboxState.SENT, ids[1]: OutboxState.FAILED,
                      ids[2]: OutboxState.SENT}
    assert (result.stats.sent, result.stats.failed) == (2, 1)
