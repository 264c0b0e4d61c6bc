"""Messages the broker accepted whose SENT mark was lost with the database: counted and named,
not reported as "nothing sent" (seen live: a relay --once through a proxy killed mid-run
printed sent 400 while 450 were on the broker, 50 left SENDING without a word)."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa

from consumer_kit.core.progress import committed_before
from consumer_kit.core.states import OutboxState
from outbox_producer import Relay
from tests.conftest import Db
from tests.producer.test_relay import publish_many, row
from tests.recording import RecordingTransport


def lose_the_mark(relay: Relay, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def mark_sent(*_args: object, **_kwargs: object) -> tuple[int, int]:
        raise error
    monkeypatch.setattr(relay.sender, "mark_sent", mark_sent)


def test_messages_sent_whose_mark_an_outage_lost_are_counted_and_named_when_once_gives_up(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 3 due rows, and a database that goes away as the relay marks them SENT
    ids = publish_many(sqlite_db, 3)
    transport = RecordingTransport()
    relay = Relay(sqlite_db.engine, transport, table=sqlite_db.names.outbox,
                  once_outage_limit=0)
    lose_the_mark(relay, monkeypatch, sa.exc.OperationalError(
        "UPDATE", {}, sqlite3.OperationalError("database is locked")))
    # When a --once run gives up on the outage
    result = relay.run_once()
    # Then the 3 messages that reached the broker are counted, and the reason says what
    # becomes of them (SENDING until the lease ends, then sent again)
    assert transport.counts() == {mid: 1 for mid in ids}
    assert {row(sqlite_db, m)["state"] for m in ids} == {int(OutboxState.SENDING)}
    assert result.stats.sent == 0 and result.stats.unmarked == 3
    assert result.gave_up is not None and "3 sent but not marked SENT" in result.gave_up


def test_a_fatal_error_after_sends_whose_mark_was_lost_says_they_were_sent(
        sqlite_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a mark that fails with an error waiting cannot fix, after the sends
    publish_many(sqlite_db, 2)
    relay = Relay(sqlite_db.engine, RecordingTransport(), table=sqlite_db.names.outbox)
    lose_the_mark(relay, monkeypatch, sa.exc.IntegrityError(
        "UPDATE", {}, sqlite3.IntegrityError("CHECK constraint failed")))
    # When the relay stops on it
    with pytest.raises(sa.exc.IntegrityError) as raised:
        relay.run_once()
    # Then the error says the messages went out (the CLI exits 1 with that, not 2, its
    # "nothing was done")
    done = committed_before(raised.value)
    assert done is not None and "2 sent but not marked SENT" in done



def test_messages_sent_in_a_lock_batch_whose_transaction_was_lost_are_counted(
        server_db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a --claim lock relay whose marks fail after its sends (they roll back with the
    # transaction: the rows are due again, sent twice, consumers dedupe)
    ids = publish_many(server_db, 2)
    transport = RecordingTransport()
    relay = Relay(server_db.engine, transport, table=server_db.names.outbox, claim="lock")
    lose_the_mark(relay, monkeypatch, sa.exc.IntegrityError(
        "UPDATE", {}, Exception("CHECK constraint failed")))
    # When the relay stops on it
    with pytest.raises(sa.exc.IntegrityError) as raised:
        relay.run_once()
    # Then the error says the messages went out, as the lease mode says it (exit 1, not 2)
    assert transport.counts() == {mid: 1 for mid in ids}
    done = committed_before(raised.value)
    assert done is not None and "2 sent but not marked SENT" in done
