"""The after-commit dispatcher: sends at once after commit, never before, never on rollback."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.states import OutboxState
from outbox_producer import Dispatcher, Outbox, Relay, ops
from outbox_producer.claim import Claimer
from outbox_producer.outbox import _SESSION_KEY
from tests.conftest import Db
from tests.recording import RecordingTransport, SlowTransport


def states(db: Db) -> list[int]:
    with db.engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT state FROM {db.names.outbox} ORDER BY id"))
                    .scalars())


def dispatching(db: Db) -> tuple[RecordingTransport, Dispatcher, Outbox]:
    """A recording transport, a started dispatcher sending to it, and an outbox handing it
    its committed rows."""
    transport = RecordingTransport()
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox).start()
    return transport, dispatcher, Outbox(db.engine, producer="orders", table=db.names.outbox,
                                         dispatcher=dispatcher)


def test_committed_rows_are_sent_after_commit_and_marked_sent(db: Db) -> None:
    # Given
    transport, dispatcher, outbox = dispatching(db)
    try:
        # When
        with Session(db.engine) as session, session.begin():
            mid = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
            assert transport.sent == []  # nothing before the commit
        assert dispatcher.flush(10)
        # Then
        assert list(transport.counts()) == [mid]
        assert states(db) == [int(OutboxState.SENT)]
    finally:
        dispatcher.close()


def test_a_rolled_back_session_sends_nothing(db: Db) -> None:
    transport, dispatcher, outbox = dispatching(db)
    try:
        with Session(db.engine) as session:
            session.begin()
            outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
            session.rollback()
            assert not session.info.get(_SESSION_KEY)  # forgotten, not left for a later commit
            with session.begin():
                pass  # a later commit of the same session must not resurrect the row
        assert dispatcher.flush(10)
        assert transport.sent == []
        assert states(db) == []
    finally:
        dispatcher.close()


def _message_states(db: Db) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {str(m): int(s) for m, s in conn.execute(sa.text(
            f"SELECT message_id, state FROM {db.names.outbox}"))}


def test_a_session_joined_to_an_outer_transaction_that_rolls_back_sends_nothing(db: Db) -> None:
    # Given a Session joined to its caller's transaction (SQLAlchemy's "join into an external
    # transaction"): its commit commits nothing, the caller's rollback undoes the row
    transport = RecordingTransport()
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox)
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    with db.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode="rollback_only") as session:
            outbox.publish(session, "T", {"n": "rolled back"}, biz_type="t", biz_key="A")
            session.commit()
        outer.rollback()
    # And a row another transaction commits afterwards (on SQLite it takes the same id)
    with db.engine.begin() as conn:
        committed = Outbox(db.engine, producer="orders", table=db.names.outbox).publish(
            conn, "T", {"n": "committed"}, biz_type="t", biz_key="B")
    # When the dispatcher runs
    dispatcher.start()
    try:
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    # Then the rolled-back message never went out, and the committed row is not marked SENT
    # without being sent: it waits for the relay, which sends it once
    assert transport.sent == []
    assert _message_states(db) == {committed: int(OutboxState.PENDING)}
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    assert dict(transport.counts()) == {committed: 1}


@pytest.mark.parametrize("savepoint_ends", ["released", "rolled back"])
def test_a_savepoints_end_sends_the_rows_of_the_transaction_around_it_at_its_commit(
        db: Db, savepoint_ends: str) -> None:
    # Given rows published before, inside and after a savepoint (begin_nested): its release
    # fires after_commit, its rollback after_rollback, and the transaction goes on either way
    transport, dispatcher, outbox = dispatching(db)
    try:
        with Session(db.engine) as session, session.begin():
            before = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="before")
            savepoint = session.begin_nested()
            inside = outbox.publish(session, "T", {"n": 2}, biz_type="t", biz_key="inside")
            if savepoint_ends == "released":
                savepoint.commit()
            else:
                savepoint.rollback()
            after = outbox.publish(session, "T", {"n": 3}, biz_type="t", biz_key="after")
            assert transport.sent == []  # nothing before the commit
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    # Then every committed row went out at once (no wait for the relay), a rolled-back one never
    committed = [before, after] if savepoint_ends == "rolled back" else [before, inside, after]
    assert dict(transport.counts()) == dict.fromkeys(committed, 1)
    assert _message_states(db) == dict.fromkeys(committed, int(OutboxState.SENT))


def test_a_row_the_relay_already_claimed_is_not_sent_again_by_the_dispatcher(db: Db) -> None:
    transport = RecordingTransport()
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
    Relay(db.engine, transport, table=db.names.outbox).run_once()
    with db.engine.connect() as conn:
        row = dict(conn.execute(sa.text(f"SELECT * FROM {db.names.outbox}")).mappings().one())
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox).start()
    try:
        dispatcher.submit([{**row, "lock_version": 0}])
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    assert sum(transport.counts().values()) == 1


def test_a_process_killed_right_after_commit_leaves_the_row_for_the_relay(sqlite_db: Db) -> None:
    # Given: a producer process that commits and dies before its dispatcher can send
    script = textwrap.dedent(f"""
        import os
        from sqlalchemy.orm import Session
        from consumer_kit.core.db import make_engine
        from consumer_kit.transports.memory import MemoryTransport
        from outbox_producer import Dispatcher, Outbox
        engine = make_engine({sqlite_db.url!r})
        dispatcher = Dispatcher(engine, MemoryTransport(), table={sqlite_db.names.outbox!r})
        outbox = Outbox(engine, producer="orders", table={sqlite_db.names.outbox!r},
                        dispatcher=dispatcher)   # never started: it dies before sending
        with Session(engine) as s, s.begin():
            outbox.publish(s, "T", {{"n": 1}}, biz_type="t", biz_key="1")
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert states(sqlite_db) == [int(OutboxState.PENDING)]
    # When
    transport = RecordingTransport()
    Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox).run_once()
    # Then
    assert sum(transport.counts().values()) == 1
    assert states(sqlite_db) == [int(OutboxState.SENT)]


def test_a_broker_outage_leaves_the_rows_pending_for_the_relay_without_a_retry(db: Db) -> None:
    # Given a dispatcher whose broker is down
    transport = RecordingTransport()
    transport.fail_next = 1_000
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox).start()
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    try:
        # When two rows are committed
        with Session(db.engine) as session, session.begin():
            outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
            outbox.publish(session, "T", {"n": 2}, biz_type="t", biz_key="2")
        assert dispatcher.flush(10)
    finally:
        dispatcher.close()
    # Then they are PENDING again at once (not SENDING until the lease expires), not charged
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text(
            f"SELECT state, retry_count, lease_owner FROM {db.names.outbox}")).all()
    assert [tuple(r) for r in rows] == [(int(OutboxState.PENDING), 0, None)] * 2


def test_the_dispatcher_starts_no_send_after_half_its_lease_and_releases_the_rest(
        db: Db) -> None:
    # Given a dispatcher with a send lease of 1 s and a broker that takes 0.2 s per send
    transport = SlowTransport(0.2)
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox,
                            lease=dt.timedelta(seconds=1)).start()
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    try:
        # When ten rows are committed together
        with Session(db.engine) as session, session.begin():
            for n in range(10):
                outbox.publish(session, "T", {"n": n}, biz_type="t", biz_key=str(n))
        assert dispatcher.flush(20)
    finally:
        dispatcher.close()
    # Then what it could not send within half the lease is PENDING again for the relay, with no
    # retry charged, never left SENDING to be reclaimed while it is still being sent
    with db.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(sa.text(
            f"SELECT state, retry_count, lease_owner FROM {db.names.outbox}"))]
    pending = [r for r in rows if r[0] == int(OutboxState.PENDING)]
    assert pending and set(pending) == {(int(OutboxState.PENDING), 0, None)}
    assert len(pending) + len(transport.counts()) == 10
    assert set(rows) - set(pending) == {(int(OutboxState.SENT), 0, None)}


def test_claim_ids_compares_each_rows_own_lock_version(db: Db) -> None:
    # Given a PENDING row whose lock_version is no longer 0 (suspended, then resumed)
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        outbox.publish(conn, "T", {"n": 1}, biz_type="t", biz_key="1")
    tables = ops.OutboxTables.from_names(db.names)
    with db.engine.connect() as conn:
        [row_id] = conn.execute(sa.select(tables.outbox.c.id)).scalars()
    ops.suspend(db.engine, tables.outbox, [row_id])
    ops.resume(db.engine, tables.outbox, [row_id])
    with db.engine.connect() as conn:
        row = dict(conn.execute(sa.select(tables.outbox)).mappings().one())
    claimer = Claimer(db.engine, tables.outbox, "dispatcher")
    # When it is claimed with a stale version, then with its own
    stale = claimer.claim_rows([OutboxRow.from_mapping({**row, "lock_version": 0})])
    [claimed] = claimer.claim_rows([OutboxRow.from_mapping(row)])
    # Then only the claim with the row's own version took it, and says its new version
    assert stale == []
    assert (row["lock_version"], claimed.lock_version) == (2, 3)
    assert states(db) == [int(OutboxState.SENDING)]
