"""Tables of the SQL transport (`sql+<db-url>`): a RocketMQ-like broker kept in SQL tables.

Six tables share one prefix (`TableNames.mq_prefix`, default `ckit_mq`):

- `<p>_message`: the log. A row with a `queue_offset` is in its queue; a row without one is
  scheduled (a delayed send or a `%RETRY%group` copy) and gets its offset when `deliver_at` comes.
- `<p>_queue`: the queues of each topic and the next offset to hand out (the per-queue lock).
- `<p>_offset`: committed consume offsets per (group, topic, queue).
- `<p>_queue_lease`: which member of a group owns a queue, until when (optimistic lock).
- `<p>_member`: heartbeats of live consumers, used to share queues among a group.
- `<p>_dlq`: dead letters per group (`%DLQ%group`).
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.schema.types import (
    GROUP_LEN,
    KEYS_LEN,
    MYSQL_TABLE,
    NAME_LEN,
    REASON_LEN,
    TAGS_LEN,
    TOPIC_LEN,
    big_id,
    blob,
    timestamp,
)

#: 32 hex characters: the broker message id (RocketMQ's UNIQ_KEY), kept by retry copies.
UNIQ_KEY_LEN = 32
#: Longest prefix that keeps every derived index name within MySQL's 64 characters.
MAX_PREFIX_LEN = 40


@dataclasses.dataclass(frozen=True)
class MqTables:
    """The SQL transport's tables under one prefix."""

    prefix: str
    metadata: sa.MetaData
    message: sa.Table
    queue: sa.Table
    offset: sa.Table
    lease: sa.Table
    member: sa.Table
    dlq: sa.Table

    @property
    def all(self) -> tuple[sa.Table, ...]:
        """Every table, in creation order."""
        return (self.message, self.queue, self.offset, self.lease, self.member, self.dlq)


def validate_prefix(prefix: str) -> str:
    """Return `prefix` when it is a valid identifier short enough for every derived name.

    Raises:
        ConfigError: not an identifier, or longer than `MAX_PREFIX_LEN`.
    """
    validate_identifier(prefix, what="transport table prefix")
    if len(prefix) > MAX_PREFIX_LEN:
        raise ConfigError(
            f"transport table prefix {prefix!r} is longer than {MAX_PREFIX_LEN} characters"
        )
    return prefix


def _message(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("id", big_id(), primary_key=True, autoincrement=True, comment="row id"),
        sa.Column("uniq_key", sa.String(UNIQ_KEY_LEN), nullable=False,
                  comment="broker message id (UNIQ_KEY), the same on every retry copy"),
        sa.Column("topic", sa.String(TOPIC_LEN), nullable=False,
                  comment="topic, or %RETRY%group for a retry copy"),
        sa.Column("queue_id", sa.Integer(), nullable=False, comment="queue within the topic"),
        sa.Column("queue_offset", sa.BigInteger(), nullable=True,
                  comment="position in the queue; NULL while scheduled (delay or retry back-off)"),
        sa.Column("tags", sa.String(TAGS_LEN), nullable=True, comment="RocketMQ tags"),
        sa.Column("keys", sa.String(KEYS_LEN), nullable=True, comment="KEYS, space separated"),
        sa.Column("properties", sa.JSON(none_as_null=True), nullable=True,
                  comment="user properties (JSON)"),
        sa.Column("body", blob(), nullable=False, comment="message body"),
        sa.Column("born_at", timestamp(), nullable=False, comment="UTC of the original send"),
        sa.Column("deliver_at", timestamp(), nullable=False,
                  comment="UTC effect time: not delivered before (delays, retry back-off)"),
        sa.Column("reconsume_times", sa.Integer(), nullable=False, server_default="0",
                  comment="deliveries that answered RECONSUME_LATER so far"),
        sa.Column("origin_group", sa.String(GROUP_LEN), nullable=True,
                  comment="NULL, or the group of a %RETRY%group copy"),
        sa.Column("origin_topic", sa.String(TOPIC_LEN), nullable=True,
                  comment="NULL, or the real topic of a %RETRY%group copy"),
        sa.UniqueConstraint("topic", "queue_id", "queue_offset", name=f"uk_{name}_queue"),
        sa.Index(f"ix_{name}_scheduled", "topic", "queue_offset", "deliver_at"),
        sa.Index(f"ix_{name}_uniq_key", "uniq_key"),
        sa.Index(f"ix_{name}_born_at", "born_at"),
        comment="consumer-kit SQL transport: message log",
        **MYSQL_TABLE,
    )


def _queue(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("topic", sa.String(TOPIC_LEN), primary_key=True, comment="topic"),
        sa.Column("queue_id", sa.Integer(), primary_key=True, autoincrement=False,
                  comment="queue number, 0..N-1"),
        sa.Column("next_offset", sa.BigInteger(), nullable=False, server_default="0",
                  comment="offset the next message gets (row locked while assigning)"),
        sa.Column("created_at", timestamp(), nullable=False, comment="UTC"),
        comment="consumer-kit SQL transport: queues of each topic",
        **MYSQL_TABLE,
    )


def _offset(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True, comment="group"),
        sa.Column("topic", sa.String(TOPIC_LEN), primary_key=True, comment="topic"),
        sa.Column("queue_id", sa.Integer(), primary_key=True, autoincrement=False,
                  comment="queue"),
        sa.Column("committed_offset", sa.BigInteger(), nullable=False, server_default="0",
                  comment="every message below this offset is done for the group"),
        sa.Column("updated_at", timestamp(), nullable=False, comment="UTC of the last commit"),
        comment="consumer-kit SQL transport: committed consume offsets",
        **MYSQL_TABLE,
    )


def _lease(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True, comment="group"),
        sa.Column("topic", sa.String(TOPIC_LEN), primary_key=True, comment="topic"),
        sa.Column("queue_id", sa.Integer(), primary_key=True, autoincrement=False,
                  comment="queue"),
        sa.Column("owner", sa.String(NAME_LEN), nullable=True, comment="member id, or NULL"),
        sa.Column("lease_until", timestamp(), nullable=True,
                  comment="UTC; an expired lease may be taken over"),
        sa.Column("lock_version", sa.Integer(), nullable=False, server_default="0",
                  comment="optimistic lock: each change is a CAS on it"),
        sa.Column("updated_at", timestamp(), nullable=False, comment="UTC"),
        comment="consumer-kit SQL transport: queue ownership leases",
        **MYSQL_TABLE,
    )


def _member(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("consumer_group", sa.String(GROUP_LEN), primary_key=True, comment="group"),
        sa.Column("member_id", sa.String(NAME_LEN), primary_key=True,
                  comment="host:pid:random of one consumer"),
        sa.Column("alive_until", timestamp(), nullable=False,
                  comment="UTC; the member counts for rebalancing until then"),
        sa.Column("started_at", timestamp(), nullable=False, comment="UTC"),
        comment="consumer-kit SQL transport: consumer heartbeats",
        **MYSQL_TABLE,
    )


def _dlq(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("id", big_id(), primary_key=True, autoincrement=True, comment="row id"),
        sa.Column("consumer_group", sa.String(GROUP_LEN), nullable=False,
                  comment="the group that gave up (%DLQ%group)"),
        sa.Column("uniq_key", sa.String(UNIQ_KEY_LEN), nullable=False,
                  comment="broker message id"),
        sa.Column("topic", sa.String(TOPIC_LEN), nullable=False, comment="original topic"),
        sa.Column("queue_id", sa.Integer(), nullable=False, comment="original queue"),
        sa.Column("tags", sa.String(TAGS_LEN), nullable=True, comment="RocketMQ tags"),
        sa.Column("keys", sa.String(KEYS_LEN), nullable=True, comment="KEYS"),
        sa.Column("properties", sa.JSON(none_as_null=True), nullable=True,
                  comment="user properties (JSON)"),
        sa.Column("body", blob(), nullable=False, comment="message body"),
        sa.Column("born_at", timestamp(), nullable=False, comment="UTC of the original send"),
        sa.Column("reconsume_times", sa.Integer(), nullable=False,
                  comment="reconsumes before giving up"),
        sa.Column("reason", sa.String(REASON_LEN), nullable=True, comment="why"),
        sa.Column("moved_at", timestamp(), nullable=False, comment="UTC"),
        sa.Index(f"ix_{name}_group_moved", "consumer_group", "moved_at"),
        comment="consumer-kit SQL transport: dead letters",
        **MYSQL_TABLE,
    )


def mq_tables(prefix: str, metadata: sa.MetaData | None = None) -> MqTables:
    """Define the transport's tables named `<prefix>_*` on `metadata` (a new one by default).

    Raises:
        ConfigError: the prefix is not a valid identifier or is too long.

    >>> mq_tables("ckit_mq").message.name
    'ckit_mq_message'
    >>> mq_tables("abc").prefix
    'abc'
    """
    validate_prefix(prefix)
    metadata = metadata if metadata is not None else sa.MetaData()
    return MqTables(
        prefix=prefix,
        metadata=metadata,
        message=_message(metadata, f"{prefix}_message"),
        queue=_queue(metadata, f"{prefix}_queue"),
        offset=_offset(metadata, f"{prefix}_offset"),
        lease=_lease(metadata, f"{prefix}_queue_lease"),
        member=_member(metadata, f"{prefix}_member"),
        dlq=_dlq(metadata, f"{prefix}_dlq"),
    )

