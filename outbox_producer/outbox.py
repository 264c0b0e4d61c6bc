"""`Outbox.publish`: write a message in the caller's transaction; send it right after commit."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import PayloadError
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.schema import (
    BIZ_KEY_LEN,
    BIZ_TYPE_LEN,
    DEFAULT_OUTBOX_TABLE,
    KEYS_LEN,
    TAGS_LEN,
    TOPIC_LEN,
    outbox_table,
)
from consumer_kit.core.states import OutboxState
from outbox_producer.ids import new_message_id
from outbox_producer.payload import encode_payload

if TYPE_CHECKING:
    from outbox_producer.dispatcher import Dispatcher

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 10
_SESSION_KEY = "ckit_outbox_pending"


class Outbox:
    """The producer's local message table.

    `engine` (an Engine or a URL) names the database that holds the outbox table; a bad URL
    fails here with `ConfigError`. `publish` never uses it: it writes through the caller's
    connection or session, so the row commits with the business change. It stays in the public
    signature `Outbox(engine, *, producer=...)`, and as `Outbox.engine`, so code holding an outbox
    can reach its database (e.g. to build the `Dispatcher` or a `Relay` on the same engine).

    >>> outbox = Outbox(engine, producer="order-service")          # doctest: +SKIP
    >>> with Session(engine) as s, s.begin():                        # doctest: +SKIP
    ...     s.add(Order(id=42))
    ...     outbox.publish(s, "ORDER_CREATED", {"order_id": 42},
    ...                    biz_type="order", biz_key="42")
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        producer: str,
        table: str = DEFAULT_OUTBOX_TABLE,
        max_retries: int = DEFAULT_MAX_RETRIES,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.engine = make_engine(engine)
        self.producer = producer
        self.table = outbox_table(sa.MetaData(), table)
        self.max_retries = max_retries
        self.dispatcher = dispatcher

    def publish(
        self,
        conn_or_session: Connection | Session,
        topic: str,
        payload: Any,
        *,
        biz_type: str,
        biz_key: str,
        tags: str | None = None,
        keys: Sequence[str] | str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: dt.timedelta | float | None = None,
    ) -> str:
        """Write one message in the caller's transaction and return its message id.

        No network I/O happens here. With a `Session`, the row is handed to the dispatcher
        after the commit (never before; nothing on rollback); with a `Connection`, the relay
        sends it. Publishing the same `(biz_type, biz_key)` again returns the first message id
        and writes nothing.

        Raises:
            PayloadError: the payload is not serializable or a field is too long (nothing is
                written; raise it out of your transaction to roll the business change back).
        """
        body = encode_payload(payload)
        props = _check_fields(topic, biz_type, biz_key, tags, keys, headers)
        now = utcnow()
        delay_s = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay or 0)
        message_id = new_message_id()
        row = {
            "message_id": message_id, "biz_type": biz_type, "biz_key": biz_key, "topic": topic,
            "tags": tags, "keys": _keys_text(keys), "headers": props or None, "body": body,
            "state": int(OutboxState.PENDING), "retry_count": 0, "max_retries": self.max_retries,
            "next_retry_at": now + dt.timedelta(seconds=delay_s), "lock_version": 0,
            "created_by": self.producer, "updated_by": self.producer,
            "gmt_create": now, "gmt_modified": now,
        }
        conn = _connection(conn_or_session)
        # No look-up first: the unique (biz_type, biz_key) index decides, and a duplicate costs
        # one failed INSERT. It leaves the caller's transaction usable: MySQL/MariaDB and SQLite
        # undo just the statement; PostgreSQL would abort the transaction, so there the INSERT
        # runs in a SAVEPOINT.
        try:
            if conn.dialect.name == "postgresql":
                with conn.begin_nested():
                    row_id = self._insert(conn, row)
            else:
                row_id = self._insert(conn, row)
        except IntegrityError:
            existing = self._existing_id(conn, biz_type, biz_key)
            if existing is None:
                raise
            log.info("message %s: %s:%s already published", existing, biz_type, biz_key)
            return existing
        if isinstance(conn_or_session, Session) and self.dispatcher is not None and delay_s <= 0:
            self._after_commit(conn_or_session, OutboxRow.from_mapping({**row, "id": row_id}))
        log.debug("message %s published to %s", message_id, topic)
        return message_id

    def _insert(self, conn: Connection, row: dict[str, Any]) -> int:
        result = conn.execute(sa.insert(self.table).values(**row))
        return int(result.inserted_primary_key[0])  # type: ignore[index]

    def _existing_id(self, conn: Connection, biz_type: str, biz_key: str) -> str | None:
        t = self.table
        query = sa.select(t.c.message_id).where(t.c.biz_type == biz_type, t.c.biz_key == biz_key)
        if conn.dialect.name in ("mysql", "mariadb"):
            # A locking read sees the latest committed row: under REPEATABLE READ a plain SELECT
            # reads the caller's snapshot, which misses a row committed by a concurrent publish
            # after it was taken (the failed INSERT already holds this shared lock).
            query = query.with_for_update(read=True)
        found = conn.execute(query).scalar()
        return str(found) if found is not None else None

    def _after_commit(self, session: Session, row: OutboxRow) -> None:
        assert self.dispatcher is not None
        session.info.setdefault(_SESSION_KEY, []).append((self.dispatcher, row))


@sa.event.listens_for(Session, "after_commit")
def _hand_over_after_commit(session: Session) -> None:
    """After the outermost commit: give the session's published rows to their dispatchers."""
    pending: list[tuple[Dispatcher, OutboxRow]] | None = session.info.pop(_SESSION_KEY, None)
    if not pending:
        return
    by_dispatcher: dict[int, tuple[Dispatcher, list[OutboxRow]]] = {}
    for dispatcher, row in pending:
        by_dispatcher.setdefault(id(dispatcher), (dispatcher, []))[1].append(row)
    for dispatcher, rows in by_dispatcher.values():
        dispatcher.submit(rows)


@sa.event.listens_for(Session, "after_rollback")
def _forget_after_rollback(session: Session) -> None:
    """A rolled-back transaction sends nothing."""
    session.info.pop(_SESSION_KEY, None)


def _connection(conn_or_session: Connection | Session) -> Connection:
    if isinstance(conn_or_session, Session):
        return conn_or_session.connection()
    if isinstance(conn_or_session, Connection):
        return conn_or_session
    raise PayloadError("publish() needs the caller's SQLAlchemy Connection or Session, not "
                       f"{type(conn_or_session).__name__}")


def _keys_text(keys: Sequence[str] | str | None) -> str | None:
    if keys is None:
        return None
    items = keys.split() if isinstance(keys, str) else [str(k) for k in keys]
    return " ".join(items) or None


def _check_fields(
    topic: str, biz_type: str, biz_key: str, tags: str | None,
    keys: Sequence[str] | str | None, headers: Mapping[str, str] | None,
) -> dict[str, str]:
    checks = [("topic", topic, TOPIC_LEN), ("biz_type", biz_type, BIZ_TYPE_LEN),
              ("biz_key", biz_key, BIZ_KEY_LEN), ("tags", tags, TAGS_LEN),
              ("keys", _keys_text(keys), KEYS_LEN)]
    for name, value, limit in checks:
        if value is None and name in ("tags", "keys"):
            continue
        if not isinstance(value, str) or not value:
            raise PayloadError(f"{name} must be a non-empty string, got {value!r}")
        if len(value) > limit:
            raise PayloadError(f"{name} is {len(value)} characters; the column holds {limit}")
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise PayloadError("headers must be a mapping of strings")
    return {str(k): str(v) for k, v in headers.items()}
