"""`Outbox.publish`: write a message in the caller's transaction; send it right after commit."""

from __future__ import annotations

import datetime as dt
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from consumer_kit.core.autocommit import commits_each_statement
from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError, PayloadError, PublishConflict
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.same_database import database_mismatch
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
from outbox_producer import validation
from outbox_producer.ids import MESSAGE_ID_CHARS, new_message_id
from outbox_producer.insert import OutboxInsert
from outbox_producer.payload import encode_payload
from outbox_producer.validation import UNSENDABLE

#: The largest `max_retries` its INT column holds
MAX_RETRIES_LIMIT = 2**31 - 1
#: The longest `keys` text: every message travels with its id as the first KEYS entry, and the
#: SQL transport keeps the KEYS, that id and a space included, in a column of `KEYS_LEN`
KEYS_ROOM = KEYS_LEN - MESSAGE_ID_CHARS - 1

if TYPE_CHECKING:
    from outbox_producer.dispatcher import Dispatcher

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 10
_SESSION_KEY = "ckit_outbox_pending"
_PENDING = int(OutboxState.PENDING)


class Outbox:
    """The producer's local message table.

    `engine` (an Engine or a URL) names the database that holds the outbox table; a bad URL
    fails here with `ConfigError`. `publish` never uses it: it writes through the caller's
    connection or session, so the row commits with the business change. It stays in the public
    signature `Outbox(engine, *, producer=...)`, and as `Outbox.engine`, so code holding an outbox
    can reach its database (e.g. to build the `Dispatcher` or a `Relay` on the same engine).

    `max_body_bytes` is the largest body `publish` accepts: by default the limit of the
    dispatcher's transport, else RocketMQ's (`DEFAULT_ROCKETMQ_MAX_BODY_BYTES`); give it when the
    relay sends through another transport than the dispatcher. Bodies RocketMQ would carry as
    base64 (not NUL-free UTF-8) are counted at their base64 size unless the dispatcher's
    transport is known not to be RocketMQ.

    >>> outbox = Outbox(engine, producer="order-service")          # doctest: +SKIP
    >>> with Session(engine) as s, s.begin():                        # doctest: +SKIP
    ...     s.add(Order(id=42))
    ...     outbox.publish(s, "ORDER_CREATED", {"order_id": 42},
    ...                    biz_type="order", biz_key="42")

    Raises:
        ConfigError: a bad URL, a producer name that cannot name its receipt topic, or a
            non-positive `max_body_bytes` / negative `max_retries`.
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        producer: str,
        table: str = DEFAULT_OUTBOX_TABLE,
        max_retries: int = DEFAULT_MAX_RETRIES,
        dispatcher: Dispatcher | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self.engine = make_engine(engine)
        self.producer = validation.check_producer(producer)
        self.table = outbox_table(sa.MetaData(), table)
        if (isinstance(max_retries, bool) or not isinstance(max_retries, int)
                or not 0 <= max_retries <= MAX_RETRIES_LIMIT):
            raise ConfigError(f"max_retries must be an integer from 0 to {MAX_RETRIES_LIMIT} "
                              f"(the column's INT), not {max_retries!r}")
        self.max_retries = max_retries
        self.dispatcher = dispatcher
        #: the last caller's engine found to reach the dispatcher's database (`_dispatches`),
        #: and every engine judged, with the dispatcher it was judged against and the verdict
        self._dispatch_engine: Engine | None = None
        self._dispatch_for: Dispatcher | None = None
        self._judged: weakref.WeakKeyDictionary[Engine, tuple[Dispatcher, bool]] = (
            weakref.WeakKeyDictionary())
        if dispatcher is not None:
            if dispatcher.table.name != self.table.name:
                raise ConfigError(
                    f"the dispatcher claims from table {dispatcher.table.name!r}, this outbox "
                    f"writes {self.table.name!r}: it would send nothing (give both the same "
                    "table=)")
            mismatch = database_mismatch(self.engine, dispatcher.engine)
            if mismatch is not None:
                raise ConfigError(
                    f"the dispatcher works on another database than the outbox ({mismatch}): "
                    "it would send none of its rows; build the Dispatcher on the outbox's engine")
        transport = dispatcher.sender.transport if dispatcher is not None else None
        limit = max_body_bytes if max_body_bytes is not None else (
            transport.max_body_bytes if transport is not None else _rocketmq_limit())
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigError(f"max_body_bytes must be a positive integer, not {limit!r}")
        self.max_body_bytes = limit
        self._base64_when_binary = transport is None or transport.scheme == "rocketmq"
        self._insert = OutboxInsert(self.table)

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

        Every rule a message must meet to be sent is checked here, before anything is written
        (`outbox_producer.validation`, RocketMQ's rules whatever the transport), so the relay
        never is the first to find a message that cannot go out.

        Raises:
            PayloadError: the payload is not serializable or over `max_body_bytes`; a field is
                too long or breaks RocketMQ's rules (topic name, tags with `||`, a key with
                whitespace, a header named like an envelope or RocketMQ property, a bad
                `delay`). Nothing is written; raise it out of your transaction to roll the
                business change back.
            PublishConflict: the `(biz_type, biz_key)` was published before for another
                topic (the message names that message id and topic); nothing is written.
            ConfigError: `conn_or_session` commits each statement on its own (autocommit), so
                the row could not share the business change's transaction; nothing is written.
        """
        # The common call (no keys, headers or delay; a topic, biz_type and tags seen before)
        # skips their checks' calls: run right after a round trip, with little in the CPU's
        # caches, every call on this path costs several times what it costs in a loop.
        body = encode_payload(payload)
        validation.check_body_size(body, self.max_body_bytes,
                                   base64_when_binary=self._base64_when_binary)
        keys_text = _check_fields(topic, biz_type, biz_key, tags, keys)
        props = validation.check_headers(headers) if headers is not None else None
        now = utcnow()
        delay_s = validation.delay_seconds(delay, now) if delay is not None else 0.0
        message_id = new_message_id()
        row = {
            "message_id": message_id, "biz_type": biz_type, "biz_key": biz_key,
            "topic": topic, "tags": tags, "keys": keys_text, "headers": props or None,
            "body": body, "state": _PENDING, "retry_count": 0, "max_retries": self.max_retries,
            "next_retry_at": now + dt.timedelta(seconds=delay_s) if delay_s else now,
            "lock_version": 0, "created_by": self.producer, "updated_by": self.producer,
            "gmt_create": now, "gmt_modified": now,
        }
        conn = (conn_or_session if type(conn_or_session) is Connection
                else _connection(conn_or_session))
        # No look-up first: the unique (biz_type, biz_key) index decides, and a duplicate costs
        # one INSERT that writes nothing. It leaves the caller's transaction usable: MySQL/
        # MariaDB and SQLite undo just the failed statement; PostgreSQL's INSERT says ON
        # CONFLICT DO NOTHING (see outbox_producer.insert).
        if commits_each_statement(conn):
            raise ConfigError(
                "publish() needs a transaction, and this connection commits each statement on "
                "its own (autocommit): the message would commit apart from the business change "
                "beside it. Nothing written; publish on a connection without "
                "isolation_level='AUTOCOMMIT'")
        dispatch = (isinstance(conn_or_session, Session) and self.dispatcher is not None
                    and delay_s <= 0)
        if dispatch and (conn.engine is not self._dispatch_engine
                         or self.dispatcher is not self._dispatch_for):
            dispatch = self._dispatches(conn.engine)
        try:
            row_id = self._insert(conn, row, want_id=dispatch)
        except IntegrityError:
            row_id, existing = None, self._existing(conn, biz_type, biz_key)
            if existing is None:
                raise
        else:
            existing = None if row_id is not None else self._existing(conn, biz_type, biz_key)
            if row_id is None and existing is None:  # a snapshot older than the winning row
                raise PublishConflict(
                    f"{biz_type}:{biz_key} is held by a row this transaction cannot see (its "
                    "snapshot predates it): nothing written; retry the transaction")
        if existing is not None:
            existing_id, existing_topic = existing
            if existing_topic != topic:
                raise PublishConflict(
                    f"{biz_type}:{biz_key} was already published as message {existing_id} to "
                    f"topic {existing_topic!r}, not {topic!r}: nothing written (a business "
                    "event goes to one topic; use another biz_type or biz_key)") from None
            log.info("message %s: %s:%s already published", existing_id, biz_type, biz_key)
            return existing_id
        if dispatch:
            assert isinstance(conn_or_session, Session)
            self._after_commit(conn_or_session, conn,
                               OutboxRow.from_mapping({**row, "id": row_id}))
        log.debug("message %s published to %s", message_id, topic)
        return message_id

    def _existing(self, conn: Connection, biz_type: str, biz_key: str
                  ) -> tuple[str, str] | None:
        """(message id, topic) of the row holding the business key."""
        t = self.table
        query = sa.select(t.c.message_id, t.c.topic).where(t.c.biz_type == biz_type,
                                                           t.c.biz_key == biz_key)
        if conn.dialect.name in ("mysql", "mariadb"):
            # A locking read sees the latest committed row: under REPEATABLE READ a plain SELECT
            # reads the caller's snapshot, which misses a row committed by a concurrent publish
            # after it was taken (the failed INSERT already holds this shared lock).
            query = query.with_for_update(read=True)
        found = conn.execute(query).first()
        return (str(found[0]), str(found[1])) if found is not None else None

    def _dispatches(self, engine: Engine) -> bool:
        """Whether rows written through `engine` go to the dispatcher: not when it works on
        another database, where its claim would find none of them. Such rows are left to the
        relay of the database they were written to (a warning, once per engine)."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        judged = self._judged.get(engine)
        if judged is None or judged[0] is not dispatcher:
            mismatch = database_mismatch(engine, dispatcher.engine)
            judged = (dispatcher, mismatch is None)
            self._judged[engine] = judged
            if mismatch is not None:
                log.warning("publish through a Session on another database than the outbox's "
                            "dispatcher works on (%s, the first is the Session's): its rows are "
                            "left to the relay of that database", mismatch)
        if judged[1]:
            self._dispatch_engine, self._dispatch_for = engine, dispatcher
        return judged[1]

    def _after_commit(self, session: Session, conn: Connection, row: OutboxRow) -> None:
        assert self.dispatcher is not None
        session.info.setdefault(_SESSION_KEY, []).append((self.dispatcher, conn, row))


@sa.event.listens_for(Session, "after_commit")
def _hand_over_after_commit(session: Session) -> None:
    """After the session's outermost commit: give its published rows to their dispatchers,
    unless the commit did not reach the database. A savepoint's release (`begin_nested`) fires
    this event too: the transaction around it goes on, and so do its rows.

    A Session joined to a transaction its caller began on a Connection (SQLAlchemy's "join
    into an external transaction", `join_transaction_mode`) commits nothing of it: that
    transaction may still roll back. Its rows are left to the relay, which sends them once
    committed. The dispatcher's claim also matches each row's message id (`claim_rows`), so a
    row that never committed is never sent, even where its id went to another row."""
    if session.in_nested_transaction():
        return
    pending: list[tuple[Dispatcher, Connection, OutboxRow]] | None = session.info.pop(
        _SESSION_KEY, None)
    if not pending:
        return
    by_dispatcher: dict[int, tuple[Dispatcher, list[OutboxRow]]] = {}
    for dispatcher, conn, row in pending:
        if conn.in_transaction():  # the caller's transaction is still open: not committed
            continue
        by_dispatcher.setdefault(id(dispatcher), (dispatcher, []))[1].append(row)
    for dispatcher, rows in by_dispatcher.values():
        dispatcher.submit(rows)


@sa.event.listens_for(Session, "after_rollback")
def _forget_after_rollback(session: Session) -> None:
    """A rolled-back transaction sends nothing. A savepoint's rollback leaves the rows of the
    transaction around it: those still commit with it (the rows written inside the savepoint
    are gone, and the dispatcher's claim, which matches each row's message id, finds nothing
    of them)."""
    if not session.in_nested_transaction():
        session.info.pop(_SESSION_KEY, None)


def _connection(conn_or_session: Connection | Session) -> Connection:
    if isinstance(conn_or_session, Session):
        return conn_or_session.connection()
    if isinstance(conn_or_session, Connection):
        return conn_or_session
    raise PayloadError("publish() needs the caller's SQLAlchemy Connection or Session, not "
                       f"{type(conn_or_session).__name__}")


def _rocketmq_limit() -> int:
    """RocketMQ's body limit, the default when no dispatcher says which transport sends."""
    from consumer_kit.transports.rocketmq.wire import DEFAULT_ROCKETMQ_MAX_BODY_BYTES

    return DEFAULT_ROCKETMQ_MAX_BODY_BYTES


def _check_fields(topic: str, biz_type: str, biz_key: str, tags: str | None,
                  keys: Sequence[str] | str | None) -> str | None:
    """Check the row's text fields against their columns and RocketMQ's rules; return the
    KEYS column. A (topic, biz_type, tags) that passed once is remembered (a service publishes
    a handful of them): only `biz_key` and `keys` are checked on every call."""
    known = (topic, biz_type, tags) if (type(topic) is str and type(biz_type) is str
                                        and (tags is None or type(tags) is str)) else None
    if keys is None and known in _KNOWN and type(biz_key) is str \
            and 0 < len(biz_key) <= BIZ_KEY_LEN:
        _control_characters("biz_key", biz_key)
        return None
    keys_text = validation.keys_text(keys)
    checks = [("biz_key", biz_key, BIZ_KEY_LEN), ("keys", keys_text, KEYS_ROOM)]
    if known is None or known not in _KNOWN:
        checks += [("topic", topic, TOPIC_LEN), ("biz_type", biz_type, BIZ_TYPE_LEN),
                   ("tags", tags, TAGS_LEN)]
    for name, value, limit in checks:
        if value is None and name in ("tags", "keys"):
            continue
        if not isinstance(value, str) or not value:
            raise PayloadError(f"{name} must be a non-empty string, got {value!r}")
        if len(value) > limit:
            room = (f"{limit} fit beside the message id, the first KEYS entry (the SQL "
                    f"transport's KEYS column holds {KEYS_LEN})" if name == "keys"
                    else f"the column holds {limit}")
            raise PayloadError(f"{name} is {len(value)} characters; {room}")
    if known is None or known not in _KNOWN:
        validation.check_topic(topic)
        validation.check_tags(tags)
        _control_characters("biz_type", biz_type)
        if known is not None:
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[known] = None
    _control_characters("biz_key", biz_key)
    return keys_text


#: (topic, biz_type, tags) that passed `_check_fields` (bounded; cleared when full)
_KNOWN: dict[tuple[str, str, str | None], None] = {}
_KNOWN_MAX = 4096


def _control_characters(name: str, value: str) -> None:
    """Refuse what the `ckit_biz` property cannot carry (control characters: RocketMQ 5 refuses
    them; a lone surrogate: no encoding can) and what a key comparison would lose (leading or
    trailing whitespace, which MariaDB's binary collation ignores)."""
    if UNSENDABLE.search(value) or value != value.strip():
        raise PayloadError(f"{name} {value!r} has control characters, a lone surrogate, or "
                           "leading or trailing whitespace (it travels in the ckit_biz "
                           "property, and is a unique key)")
