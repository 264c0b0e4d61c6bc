"""The tables of a day-partitioned outbox (`outbox_producer.ops.partitions`): its definition,
the trigger that fills its key table, the partition count a server takes, and the clean-up of a
`create` that failed part way."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.identifiers import validate_identifier
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.schema.types import MYSQL_TABLE

#: the upper bound of the catch-all partition `pmax`
MAX = "MAXVALUE"
#: the partitions a MySQL or MariaDB table takes, at most (`pmax` among them)
MAX_PARTITIONS = 8192


def check_days_ahead(days_ahead: int) -> None:
    """Refuse a `--days-ahead` whose partitions (today's, those days' and `pmax`) are more than
    a table takes, before any DDL.

    Raises:
        ConfigError: naming --days-ahead and the largest one taken.
    """
    if days_ahead + 2 > MAX_PARTITIONS:
        raise ConfigError(f"--days-ahead {days_ahead}: at most {MAX_PARTITIONS - 2} (a "
                          f"MySQL or MariaDB table takes {MAX_PARTITIONS} partitions, today's "
                          "and pmax among them)")


def key_trigger(outbox: str) -> str:
    """`CREATE TRIGGER <outbox>_biz_key`: each new outbox row's key into `<outbox>_key`, in the
    same statement (a duplicate key fails the INSERT as a unique key of the outbox would)."""
    keys = validate_identifier(f"{outbox}_key")
    return (f"CREATE TRIGGER {validate_identifier(outbox + '_biz_key')} BEFORE INSERT ON "
            f"{outbox} FOR EACH ROW INSERT INTO {keys} (biz_type, biz_key, message_id, "
            "gmt_create) VALUES (NEW.biz_type, NEW.biz_key, NEW.message_id, NEW.gmt_create)")


def partitioned_outbox_table(metadata: sa.MetaData, name: str) -> sa.Table:
    """The outbox's columns and indexes with the keys a partitioned InnoDB table allows."""
    base = outbox_table(sa.MetaData(), name)
    columns = []
    for column in base.columns:
        copy = column._copy()
        copy.primary_key = column.name in ("id", "message_id")
        columns.append(copy)
    indexes = [sa.Index(i.name, *[c.name for c in i.columns]) for i in base.indexes]
    return sa.Table(
        name, metadata, *columns, *indexes,
        sa.UniqueConstraint("message_id", name=f"uk_{name}_message_id"),
        sa.Index(f"ix_{name}_biz", "biz_type", "biz_key"),
        comment="consumer-kit transactional outbox, partitioned by day of message_id",
        **MYSQL_TABLE,
    )


def drop_made(engine: Engine, outbox: str, *, keys: bool = True) -> None:
    """Drop what a failed `create` made of a partitioned outbox: MySQL and MariaDB commit each
    CREATE and ALTER by itself, so the outbox table (maybe unpartitioned, or without its key
    trigger) and its key table stay behind the error, and a second `create` would refuse the
    table. Only while the outbox is empty: a row in it was published by someone, and is kept.
    `keys`: the key table too (False when it was there before `create`: not its to drop).
    """
    key_name = validate_identifier(f"{outbox}_key")
    inspector = sa.inspect(engine)
    if not inspector.has_table(outbox):
        return
    with engine.begin() as conn:
        if conn.exec_driver_sql(f"SELECT 1 FROM {outbox} LIMIT 1").first() is not None:
            return
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {outbox}")  # its trigger with it
        if keys:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {key_name}")
