"""A row whose stored `headers` are not a JSON object fails alone: its batch still goes out."""

from __future__ import annotations

import types

import pytest
import sqlalchemy as sa

from consumer_kit.core.rows import read_headers
from consumer_kit.core.states import OutboxState
from outbox_producer import Backoff, Outbox, Relay, ops
from tests.conftest import Db
from tests.recording import RecordingTransport

FAST = Backoff(schedule=(0.0,), jitter=0.0)


def publish_three(db: Db) -> list[str]:
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with db.engine.begin() as conn:
        return [outbox.publish(conn, "T", {"i": i}, biz_type="t", biz_key=str(i),
                               headers={"h": str(i)}) for i in range(3)]


def spoil_headers(db: Db, mid: str, stored: str) -> None:
    """An operator's hand edit of one row's headers column."""
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {db.names.outbox} SET headers = :h WHERE message_id = :m"),
                     {"h": stored, "m": mid})


def states(db: Db) -> dict[str, tuple[int, str | None]]:
    with db.engine.connect() as conn:
        return {str(m): (int(s), r) for m, s, r in conn.execute(sa.text(
            f"SELECT message_id, state, fail_reason FROM {db.names.outbox}"))}


def relay_run(db: Db, claim: str, transport: RecordingTransport) -> None:
    Relay(db.engine, transport, table=db.names.outbox, backoff=FAST, claim=claim).run_once()


#: hand edits that are JSON but not an object, and what the row's fail_reason then says; the
#: string holds an object's JSON text: sent as that object it would be read as JSON twice
#: (PostgreSQL's driver decodes json itself)
NOT_OBJECTS = [('["h", "1"]', "not a JSON object but list"),
               ('"{\\"h\\": \\"smuggled\\"}"', "not a JSON object but str"),
               ('"h=1"', "not a JSON object but str")]


@pytest.mark.parametrize(("stored", "why"), NOT_OBJECTS, ids=["array", "object-text", "text"])
def test_a_row_whose_headers_are_json_but_no_object_fails_and_the_rest_of_its_batch_is_sent(
        db: Db, stored: str, why: str) -> None:
    fails_alone(db, "lease", stored, why)


def test_a_relay_claiming_by_row_lock_fails_the_json_array_alone_too(server_db: Db) -> None:
    fails_alone(server_db, "lock", *NOT_OBJECTS[0])


def fails_alone(db: Db, claim: str, stored: str, why: str) -> None:
    # Given three due rows, the middle one's headers hand-edited into JSON that is no object
    first, bad, last = publish_three(db)
    spoil_headers(db, bad, stored)
    transport = RecordingTransport()
    # When one relay run goes over them
    relay_run(db, claim, transport)
    # Then the other two went out with their headers, and the bad one is FAILED with why, the
    # same on every database
    assert transport.counts() == {first: 1, last: 1}
    assert {m.properties["h"] for m in transport.sent} == {"0", "2"}
    found = states(db)
    assert found[first][0] == found[last][0] == int(OutboxState.SENT)
    assert found[bad][0] == int(OutboxState.FAILED)
    assert f"headers column is {why}" in str(found[bad][1])


def test_a_row_whose_headers_are_not_json_on_sqlite_fails_alone(sqlite_db: Db) -> None:
    # Given three due rows, one with headers that are not JSON at all (SQLite keeps text; MariaDB
    # and PostgreSQL refuse it in a JSON column)
    db = sqlite_db
    first, bad, last = publish_three(db)
    spoil_headers(db, bad, "h=1")
    transport = RecordingTransport()
    # When the relay runs twice (the bad row used to fail the claim of the whole batch, every
    # time: none was sent, all three held under the relay's lease)
    relay_run(db, "lease", transport)
    relay_run(db, "lease", transport)
    # Then the others were sent once, and the bad row is FAILED, quoting what it holds
    assert transport.counts() == {first: 1, last: 1}
    found = states(db)
    assert found[bad][0] == int(OutboxState.FAILED)
    assert "headers column is not JSON" in str(found[bad][1]) and "'h=1'" in str(found[bad][1])


@pytest.mark.parametrize(("stored", "expected"), [
    ('{"a": "1"}', ({"a": "1"}, None)),
    (types.MappingProxyType({"a": "1"}), ({"a": "1"}, None)),
    (b'{"a": "1"}', ({"a": "1"}, None)),
    ({"a": "1"}, ({"a": "1"}, None)),
    ("null", (None, None)),
])
def test_read_headers_gives_the_object_stored(stored: object, expected: object) -> None:
    assert read_headers(stored) == expected


@pytest.mark.parametrize(("stored", "why"), [
    ("{", "is not JSON"), ('"text"', "not a JSON object but str"), ([1], "not JSON text"),
    ("7", "but int"),
])
def test_read_headers_says_why_a_value_is_not_a_json_object(stored: object, why: str) -> None:
    headers, defect = read_headers(stored)
    assert headers is None and defect is not None and why in defect


def test_show_gives_the_headers_object_on_every_database(db: Db) -> None:
    first, _, _ = publish_three(db)
    [view] = ops.show(db.engine, ops.OutboxTables.from_names(db.names), first)
    assert view.to_dict()["message"]["headers"] == {"h": "0"}


def test_show_prints_headers_that_are_not_json_as_stored_with_the_problem(sqlite_db: Db) -> None:
    # Given a row whose headers were hand-edited into text that is not JSON
    db = sqlite_db
    _, bad, _ = publish_three(db)
    spoil_headers(db, bad, "h=1")
    # When it is shown (this failed with the JSON decoder's bare message)
    [view] = ops.show(db.engine, ops.OutboxTables.from_names(db.names), bad)
    # Then the operator sees what is stored, and why it cannot be sent
    shown = view.to_dict()["message"]
    assert shown["headers"] == "h=1" and "headers column is not JSON" in shown["headers_problem"]
