"""The SQLAlchemy Core tables of both halves: the single source of truth for the schema.

`schema/*.sql` is generated from these definitions (`ckit db ddl`), and a test fails when the
files drift. The SQL transport's tables are in `consumer_kit.core.schema.mq`.
"""

from __future__ import annotations

import enum
from typing import Any

import sqlalchemy as sa

from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.schema.names import (
    DEFAULT_OUTBOX_TABLE,
    DEFAULT_PROCESSED_TABLE,
    DEFAULT_RECEIPT_TABLE,
)
from consumer_kit.core.schema.types import (
    BIZ_KEY_LEN,
    BIZ_TYPE_LEN,
    GROUP_LEN,
    KEYS_LEN,
    MESSAGE_ID_LEN,
    MYSQL_TABLE,
    NAME_LEN,
    REASON_LEN,
    TAGS_LEN,
    TOPIC_LEN,
    big_id,
    blob,
    long_text,
    timestamp,
)
from consumer_kit.core.states import STATE_COMMENT


class ProcessedStatus(str, enum.Enum):
    """Status of a row in the consumer's processed table."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"                # rejected (Reject, a permanent error): the handler decided
    DEAD_LETTERED = "DEAD_LETTERED"  # retries spent: the transport moved it to the dead letters


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
        sa.Column("sent_at", timestamp(), nullable=True,
                  comment="UTC when marked SENT (or when a receipt beat that mark)"),
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
        # SQLite hands a deleted row's id out again without AUTOINCREMENT: an archived row's id
        # would clash in the archive, and an id would name two messages over time
        sqlite_autoincrement=True,
        **MYSQL_TABLE,
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
        **MYSQL_TABLE,
    )


def receipt_table(metadata: sa.MetaData, name: str = DEFAULT_RECEIPT_TABLE) -> sa.Table:
    """Per consumer group receipts of outbox messages."""
    validate_identifier(name)
    return sa.Table(
        name,
        metadata,
        sa.Column("message_id", sa.String(MESSAGE_ID_LEN), primary_key=True,
                  comment="outbox message_id"),
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True,
                  comment="the consumer group that answered"),
        sa.Column("outcome", sa.String(16), nullable=False, comment="consumed | rejected"),
        sa.Column("reason", sa.String(REASON_LEN), nullable=True, comment="rejection reason"),
        sa.Column("received_at", timestamp(), nullable=False, comment="UTC when applied"),
        # the reconciler's large-window read: consumer_group IN (...) AND received_at >= since
        sa.Index(f"ix_{name}_group_received", "consumer_group", "received_at"),
        comment="consumer-kit per-group receipts of outbox messages",
        **MYSQL_TABLE,
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
                  comment="producer service (ckit_src): where the receipt goes"),
        sa.Column("status", sa.String(16), nullable=False,
                  comment="SUCCEEDED | FAILED (rejected) | DEAD_LETTERED (retries spent)"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="1",
                  comment="deliveries seen (reconsume count + 1)"),
        sa.Column("error", long_text(), nullable=True,
                  comment="why it FAILED or was DEAD_LETTERED"),
        sa.Column("first_seen_at", timestamp(), nullable=False, comment="UTC first delivery"),
        sa.Column("processed_at", timestamp(), nullable=False, comment="UTC of the commit"),
        sa.Column("receipt_due_at", timestamp(), nullable=True,
                  comment="UTC from when the receipt to the producer (src) is due; NULL: none "
                          "owed (sent, or no src). The processed row is the receipt outbox"),
        sa.Column("receipt_attempts", sa.Integer(), nullable=False, server_default="0",
                  comment="failed attempts to deliver the receipt (back-off)"),
        sa.Index(f"ix_{name}_processed_at", "processed_at"),
        # the receipt sender's scan: consumer_group = ? AND receipt_due_at <= ?
        sa.Index(f"ix_{name}_receipt_due", "consumer_group", "receipt_due_at"),
        comment="consumer-kit processed messages (dedupe truth)",
        **MYSQL_TABLE,
    )
