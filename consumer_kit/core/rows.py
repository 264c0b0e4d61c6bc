"""`OutboxRow`: an outbox row as the senders carry it (claimed, sent, marked).

The columns a sender needs, read once at claim time (the body is the big one). Nothing else in
the library passes outbox rows around as dicts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.states import OutboxState

#: A state by its code (a dict look-up: cheaper than `OutboxState(code)` per claimed row)
_STATES = {int(state): state for state in OutboxState}

#: The columns `OutboxRow` is read from (besides `sent_at`, read for `sent_before`).
SEND_COLUMNS = ("id", "message_id", "biz_type", "biz_key", "topic", "tags", "keys", "headers",
                "body", "retry_count", "max_retries", "created_by", "gmt_create", "lock_version")
#: What a claim selects, in this order: `OutboxRow.from_row` reads a result row by position.
READ_COLUMNS = (*SEND_COLUMNS, "state", "sent_at")


@dataclasses.dataclass(slots=True)
class OutboxRow:
    """One outbox row on its way to the broker.

    `lock_version` is the version the holder's next compare-and-set must match; `sent_before`
    is true when an earlier attempt went out (a re-send: consumers answer it with a receipt even
    when they processed the message already). `claimed_from` is the state the claim took the row
    from (PENDING; FAILED for the slow retry; SENDING for an expired lease): a row released
    unsent goes back to FAILED when it came from there, else to PENDING.
    """

    id: int
    message_id: str
    biz_type: str
    biz_key: str
    topic: str
    body: bytes
    lock_version: int
    gmt_create: dt.datetime
    tags: str | None = None
    keys: str | None = None
    headers: Mapping[str, str] | None = None
    retry_count: int = 0
    max_retries: int = 10
    created_by: str | None = None
    sent_before: bool = False
    claimed_from: OutboxState = OutboxState.PENDING
    #: why the row cannot be sent as stored (its `headers` column is not a JSON object: a hand
    #: edit, e.g. a JSON array, or on SQLite text that is not JSON); the sender fails it alone
    defect: str | None = None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any], *, sent_before: bool | None = None
                     ) -> OutboxRow:
        """Build from a result mapping (or a dict) holding `SEND_COLUMNS` (and `state`, `sent_at`
        when they were read); `sent_before` defaults to what `from_row` derives."""
        built = cls.from_row([*(row[name] for name in SEND_COLUMNS), row.get("state"),
                              row.get("sent_at")])
        if sent_before is not None:
            built.sent_before = sent_before
        return built

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> OutboxRow:
        """Build from a result row of `READ_COLUMNS`, in that order (what every claim selects).
        By position, not by name: a relay builds thousands a second, and reading each column
        through SQLAlchemy's `RowMapping` was one of the largest Python costs per row of a drain.
        `sent_before` is whether the row went out before: it was marked SENT once (`sent_at`),
        or an attempt failed (`retry_count`: a timed-out send may have reached the broker).
        `claimed_from` is the `state` read (a claim that reads after its UPDATE sets it from
        the claim's transition instead)."""
        (id_, message_id, biz_type, biz_key, topic, tags, keys, headers, body, retry_count,
         max_retries, created_by, gmt_create, lock_version, state, sent_at) = row
        retry_count = int(retry_count or 0)
        defect = None
        if headers is not None and type(headers) is not dict:
            headers, defect = read_headers(headers)
        return cls(id_, message_id, biz_type, biz_key, topic,
                   body if type(body) is bytes else bytes(body), lock_version, gmt_create,
                   tags, keys, headers, retry_count, int(max_retries or 0), created_by,
                   sent_at is not None or retry_count > 0,
                   OutboxState.PENDING if state is None else _STATES[state], defect)

    def next_version(self) -> OutboxRow:
        """This row after a compare-and-set bumped its `lock_version` (updated in place: a
        relay moves thousands of rows a second, and a copy per row costs)."""
        self.lock_version += 1
        return self


def headers_column(table: sa.Table, dialect: str) -> sa.ColumnElement[Any]:
    """`table`'s `headers` column selected as its JSON text, undecoded (`from_row` decodes it,
    row by row): SQLAlchemy's JSON type would decode it while fetching, and one row that is not
    JSON (SQLite keeps any text) would fail the whole fetch, every batch it is claimed in, so
    the rows with it too. PostgreSQL's driver decodes `json` itself: there it is cast to text,
    so that every database hands `read_headers` the same thing (a JSON string stored there would
    otherwise arrive as a Python str and be read as JSON text once more)."""
    if dialect == "postgresql":
        return sa.cast(table.c.headers, sa.Text).label("headers")
    return sa.type_coerce(table.c.headers, sa.Text).label("headers")


def read_headers(stored: Any) -> tuple[dict[str, str] | None, str | None]:
    """The `headers` column as `headers_column` reads it (JSON text; a mapping passes as it is)
    as a dict, or None and why it is not a JSON object."""
    if isinstance(stored, Mapping):
        return dict(stored), None
    if isinstance(stored, (bytes, bytearray, memoryview)):
        stored = bytes(stored).decode("utf-8", "replace")
    if not isinstance(stored, str):
        return None, f"its headers column is not JSON text but {type(stored).__name__}"
    try:
        value = json.loads(stored)
    except ValueError as exc:
        return None, f"its headers column is not JSON ({exc}): {stored[:80]!r}"
    if value is None:
        return None, None
    if not isinstance(value, dict):
        return None, f"its headers column is not a JSON object but {type(value).__name__}"
    return value, None
