"""The compare-and-set's message-id guard (`Versions.message_ids`): a row still at its version but
holding another message (an id handed out again) is not moved, on every database; and the guard
is `(id, lock_version) IN (...)` with `message_id = CASE id ... END`, not a three-column row
constructor, which MariaDB 10.11 plans in time quadratic in the rows (1.1 s for 1,000 spread ids,
the statement itself 5 ms: `python bench/repair_guard.py` times both forms)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from consumer_kit.core.schema import outbox_table
from consumer_kit.core.transitions import CHUNK, Versions, _statements, cas
from tests.conftest import Db

NOW = dt.datetime(2026, 1, 1)


def test_a_row_holding_another_message_is_not_moved_by_a_guarded_batch(db: Db) -> None:
    # Given three SENT rows at version 0
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:
        conn.execute(sa.insert(t), [
            {"message_id": f"m{i}", "biz_type": "t", "biz_key": str(i), "topic": "T",
             "body": b"{}", "state": 2, "next_retry_at": NOW, "gmt_create": NOW,
             "gmt_modified": NOW} for i in range(3)])
        rows = conn.execute(sa.select(t.c.id, t.c.lock_version, t.c.message_id)
                            .order_by(t.c.id)).all()
    # When a batch guards them, the second with a message id it does not hold
    expected = [r.message_id for r in rows]
    expected[1] = "someone-else"
    with db.engine.begin() as conn:
        changed = cas(conn, t, "repair_exhausted",
                      Versions([(r.id, r.lock_version) for r in rows], expected), now=NOW)
    # Then the other two moved, and that one did not
    with db.engine.connect() as conn:
        states = dict(conn.execute(sa.select(t.c.message_id, t.c.state)).all())
    assert changed == 2
    assert states["m1"] == 2 and states["m0"] != 2 and states["m2"] != 2


def test_the_message_id_guard_of_a_large_batch_is_a_case_beside_the_version_pairs() -> None:
    # Given a batch of a full chunk of rows with their message ids
    t = outbox_table(sa.MetaData())
    pairs = [(i * 50, 3) for i in range(CHUNK)]
    guard = Versions(pairs, [f"m{i}" for i, _ in pairs])
    # When its statements are compiled for MariaDB
    [stmt] = _statements(t, "repair_exhausted", guard, now=NOW, by=None, values=None)
    sql = str(stmt.compile(dialect=mysql.dialect()))
    # Then the rows are (id, lock_version) pairs, and each one's message id is a CASE on id
    assert "(ckit_outbox.id, ckit_outbox.lock_version) IN" in sql
    assert "ckit_outbox.message_id = CASE ckit_outbox.id" in sql
    assert "lock_version, ckit_outbox.message_id)" not in sql


def test_an_id_given_twice_with_two_messages_moves_the_row_holding_either(db: Db) -> None:
    # Given a SENT row holding m0, handed over twice under its id (the dispatcher's list: a
    # rolled-back row's id given again to a row committed later), its own message first
    t = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.begin() as conn:
        conn.execute(sa.insert(t), [{
            "message_id": "m0", "biz_type": "t", "biz_key": "0", "topic": "T", "body": b"{}",
            "state": 2, "next_retry_at": NOW, "gmt_create": NOW, "gmt_modified": NOW}])
        row = conn.execute(sa.select(t.c.id, t.c.lock_version)).one()

    # When a batch guards both (a CASE on id holds one message per id: the last one won)
    with db.engine.begin() as conn:
        changed = cas(conn, t, "repair_exhausted",
                      Versions([(row.id, row.lock_version)] * 2, ["m0", "gone"]), now=NOW)

    # Then the row holding one of them moved, as the three-column row constructor moved it
    assert changed == 1
