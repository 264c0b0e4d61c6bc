"""The `sql+<db-url>` transport: a RocketMQ-like broker kept in SQL tables (SQLite or MariaDB).

`transport` sends, schedules, retries and dead-letters; `consumer` runs a member of a group;
`group` holds a group's membership, queue leases and offsets; `database` runs short transactions
with the retry policy. The tables are defined in `consumer_kit.core.schema.mq`.
"""

from __future__ import annotations

from consumer_kit.transports.sql.transport import ConsumerSettings, SqlTransport

__all__ = ["ConsumerSettings", "SqlTransport"]
