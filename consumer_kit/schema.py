"""SQLAlchemy Core definitions of every table: the single source of truth for the schema.

`schema/*.sql` is generated from these definitions (`ckit db ddl`), and a test fails when the
files drift. Every table name is configurable through `TableNames` and validated as an identifier.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from consumer_kit.identifiers import validate_identifier

DEFAULT_OUTBOX_TABLE = "ckit_outbox"
DEFAULT_ACK_TABLE = "ckit_outbox_ack"
DEFAULT_PROCESSED_TABLE = "ckit_processed"
DEFAULT_MQ_PREFIX = "ckit_mq"

#: Maximum lengths, shared by validation in the API and the column definitions.
MESSAGE_ID_LEN = 128
BIZ_TYPE_LEN = 64
BIZ_KEY_LEN = 128
TOPIC_LEN = 255
TAGS_LEN = 255
KEYS_LEN = 512
GROUP_LEN = 128
NAME_LEN = 128
REASON_LEN = 2000


class OutboxState(enum.IntEnum):
    """States of an outbox row. The numbers are fixed: they are stored and documented in the DDL."""

    PENDING = 0
    SENDING = 1
    SENT = 2
    CONSUMED = 3
    FAILED = 4
    REJECTED = 5
    SUSPENDED = 6

    @classmethod
    def parse(cls, value: str | int) -> OutboxState:
        """Parse a state by name (any case) or code; raise `ValueError` naming the valid ones."""
        try:
            if isinstance(value, int) or str(value).isdigit():
                return cls(int(value))
            return cls[str(value).upper()]
        except (KeyError, ValueError):
            valid = ", ".join(f"{s.value}={s.name}" for s in cls)
            raise ValueError(f"unknown outbox state {value!r} (valid: {valid})") from None


#: The states that are not terminal (CONSUMED and REJECTED are, until an operator acts): an ack
#: may move a row out of them, and they make up the backlog (a small index range on `state`).
OPEN_STATES: tuple[OutboxState, ...] = (
    OutboxState.PENDING,
    OutboxState.SENDING,
    OutboxState.SENT,
    OutboxState.FAILED,
    OutboxState.SUSPENDED,
)

STATE_COMMENT = "0 PENDING, 1 SENDING, 2 SENT, 3 CONSUMED, 4 FAILED, 5 REJECTED, 6 SUSPENDED"


class AckOutcome(str, enum.Enum):
    """What a consumer group answered for a message."""

    CONSUMED = "consumed"
    REJECTED = "rejected"


class ProcessedStatus(str, enum.Enum):
    """Status of a row in the consumer's processed table."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


def big_id() -> sa.types.TypeEngine[Any]:
    """BIGINT primary key that still autoincrements on SQLite (which needs INTEGER)."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def timestamp() -> sa.types.TypeEngine[Any]:
    """DATETIME with microseconds on MySQL/MariaDB (plain DATETIME would drop them)."""
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def blob() -> sa.types.TypeEngine[Any]:
    """Message bodies: MEDIUMBLOB (16 MiB) on MySQL, BYTEA on PostgreSQL, BLOB on SQLite."""
    return (
        sa.LargeBinary()
        .with_variant(mysql.MEDIUMBLOB(), "mysql", "mariadb")
        .with_variant(postgresql.BYTEA(), "postgresql")
    )


def long_text() -> sa.types.TypeEngine[Any]:
    """Long free text (errors, reasons) that may exceed VARCHAR limits."""
    return sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


@dataclasses.dataclass(frozen=True)
class TableNames:
    """Names of every table; each is validated as an SQL identifier."""

    outbox: str = DEFAULT_OUTBOX_TABLE
    outbox_ack: str = DEFAULT_ACK_TABLE
    processed: str = DEFAULT_PROCESSED_TABLE
    mq_prefix: str = DEFAULT_MQ_PREFIX

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            validate_identifier(getattr(self, field.name), what=field.name.replace("_", " "))

    @property
    def outbox_archive(self) -> str:
        """Name of the archive table that `ckit outbox archive` moves terminal rows into."""
        return validate_identifier(f"{self.outbox}_archive")


def _outbox_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("id", big_id(), primary_key=True, autoincrement=True,
                  comment="surrogate key; relays shard on MOD(id, N)"),
        sa.Column("message_id", sa.String(MESSAGE_ID_LEN), nullable=False,
                  comment="the dedupe id (ULID) carried as ckit_id and as the RocketMQ KEYS"),
        sa.Column("biz_type", sa.String(BIZ_TYPE_LEN), nullable=False,
                  comment="business event type, e.g. ORDER_CREATED"),
        sa.Column("biz_key", sa.String(BIZ_KEY_LEN), nullable=False,
                  comment="business key; (biz_type, biz_key) publishes once"),
        sa.Column("topic", sa.String(TOPIC_LEN), nullable=False, comment="destination topic"),
        sa.Column("tags", sa.String(TAGS_LEN), nullable=True, comment="RocketMQ tags"),
        sa.Column("keys", sa.String(KEYS_LEN), nullable=True,
                  comment="extra RocketMQ KEYS, space separated (ckit_id is always added)"),
        sa.Column("headers", sa.JSON(none_as_null=True), nullable=True,
                  comment="user properties (JSON object of strings)"),
        sa.Column("body", blob(), nullable=False,
                  comment="message body bytes (UTF-8 JSON unless headers say ckit_enc)"),
        sa.Column("state", sa.SmallInteger(), nullable=False, server_default="0",
                  comment=STATE_COMMENT),
        sa.Column("retry_count", sa.Integer(), nullable=False, server_default="0",
                  comment="send attempts that failed so far"),
        sa.Column("max_retries", sa.Integer(), nullable=False, server_default="10",
                  comment="failed sends allowed before FAILED"),
        sa.Column("next_retry_at", timestamp(), nullable=False,
                  comment="UTC; the row is due for the relay from this time (delay, back-off)"),
        sa.Column("last_attempt_at", timestamp(), nullable=True, comment="UTC of the last send"),
        sa.Column("fail_reason", sa.String(REASON_LEN), nullable=True,
                  comment="last send error or consumer rejection reason"),
        sa.Column("broker_message_id", sa.String(MESSAGE_ID_LEN), nullable=True,
                  comment="the broker's id for the last successful send"),
        sa.Column("sent_at", timestamp(), nullable=True, comment="UTC when marked SENT"),
        sa.Column("consumed_at", timestamp(), nullable=True, comment="UTC when marked CONSUMED"),
        sa.Column("lease_owner", sa.String(NAME_LEN), nullable=True,
                  comment="relay/dispatcher holding the SENDING lease"),
        sa.Column("lease_until", timestamp(), nullable=True,
                  comment="UTC; an expired SENDING lease is reclaimed"),
        sa.Column("lock_version", sa.Integer(), nullable=False, server_default="0",
                  comment="optimistic lock: every transition is a CAS on (state, lock_version)"),
        sa.Column("created_by", sa.String(NAME_LEN), nullable=True,
                  comment="producer service name (ckit_src)"),
        sa.Column("updated_by", sa.String(NAME_LEN), nullable=True,
                  comment="last writer: relay, acks, reconciler, operator"),
        sa.Column("gmt_create", timestamp(), nullable=False, comment="UTC of the commit"),
        sa.Column("gmt_modified", timestamp(), nullable=False, comment="UTC of the last change"),
    ]


def outbox_table(metadata: sa.MetaData, name: str = DEFAULT_OUTBOX_TABLE) -> sa.Table:
    """The producer's local message table."""
    validate_identifier(name)
    return sa.Table(
        name,
        metadata,
        *_outbox_columns(),
        sa.UniqueConstraint("message_id", name=f"uk_{name}_message_id"),
        sa.UniqueConstraint("biz_type", "biz_key", name=f"uk_{name}_biz"),
        sa.Index(f"ix_{name}_state_next", "state", "next_retry_at"),
        sa.Index(f"ix_{name}_state_sent", "state", "sent_at"),
        sa.Index(f"ix_{name}_topic", "topic"),
        sa.Index(f"ix_{name}_gmt_create", "gmt_create"),
        comment="consumer-kit transactional outbox (local message table)",
    )


def outbox_archive_table(metadata: sa.MetaData, name: str) -> sa.Table:
    """Same columns as the outbox, without uniqueness: where `archive` moves terminal rows."""
    validate_identifier(name)
    return sa.Table(
        name,
        metadata,
        *_outbox_columns(),
        sa.Index(f"ix_{name}_message_id", "message_id"),
        comment="consumer-kit outbox archive (terminal rows moved by ckit outbox archive)",
    )


def ack_table(metadata: sa.MetaData, name: str = DEFAULT_ACK_TABLE) -> sa.Table:
    """Per consumer group acks of outbox messages."""
    validate_identifier(name)
    return sa.Table(
        name,
        metadata,
        sa.Column("message_id", sa.String(MESSAGE_ID_LEN), primary_key=True,
                  comment="outbox message_id"),
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True,
                  comment="the consumer group that acked"),
        sa.Column("outcome", sa.String(16), nullable=False, comment="consumed | rejected"),
        sa.Column("reason", sa.String(REASON_LEN), nullable=True, comment="rejection reason"),
        sa.Column("acked_at", timestamp(), nullable=False, comment="UTC when applied"),
        # the reconciler's large-window read: consumer_group IN (...) AND acked_at >= since
        sa.Index(f"ix_{name}_group_acked", "consumer_group", "acked_at"),
        comment="consumer-kit per-group acks of outbox messages",
    )


def processed_table(metadata: sa.MetaData, name: str = DEFAULT_PROCESSED_TABLE) -> sa.Table:
    """The consumer's processed-messages table: the truth for deduplication."""
    validate_identifier(name)
    return sa.Table(
        name,
        metadata,
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True,
                  comment="consumer group"),
        sa.Column("message_id", sa.String(MESSAGE_ID_LEN), primary_key=True,
                  comment="dedupe key: ckit_id, else KEYS, else broker id"),
        sa.Column("topic", sa.String(TOPIC_LEN), nullable=False, comment="topic received from"),
        sa.Column("tags", sa.String(TAGS_LEN), nullable=True, comment="tags received"),
        sa.Column("broker_message_id", sa.String(MESSAGE_ID_LEN), nullable=True,
                  comment="broker UNIQ_KEY of the delivery"),
        sa.Column("src", sa.String(NAME_LEN), nullable=True,
                  comment="producer service (ckit_src): where the ack goes"),
        sa.Column("status", sa.String(16), nullable=False, comment="SUCCEEDED | FAILED"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="1",
                  comment="deliveries seen (reconsume count + 1)"),
        sa.Column("error", long_text(), nullable=True, comment="why it FAILED"),
        sa.Column("first_seen_at", timestamp(), nullable=False, comment="UTC first delivery"),
        sa.Column("processed_at", timestamp(), nullable=False, comment="UTC of the commit"),
        sa.Index(f"ix_{name}_processed_at", "processed_at"),
        comment="consumer-kit processed messages (dedupe truth)",
    )


def build_metadata(
    names: TableNames | None = None, *, include_transport: bool = True
) -> sa.MetaData:
    """Return a MetaData holding every consumer-kit table under the given names (with the SQL
    transport's tables unless `include_transport` is false)."""
    names = names or TableNames()
    metadata = sa.MetaData()
    outbox_table(metadata, names.outbox)
    outbox_archive_table(metadata, names.outbox_archive)
    ack_table(metadata, names.outbox_ack)
    processed_table(metadata, names.processed)
    if include_transport:
        # imported here: the transport's table module builds on the helpers above
        from consumer_kit.transports.sql_schema import mq_tables

        mq_tables(names.mq_prefix, metadata)
    return metadata
