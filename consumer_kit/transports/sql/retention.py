"""Time-based retention of the SQL transport (`ckit mq purge`): delete old messages, but only
those that every consumer group of their topic has consumed.

A group is known for a topic once it holds an offset or a queue lease on it (a consumer takes
both when it first starts on a topic). A message at offset `o` of queue `q` is consumed by a
group when the group's committed offset on `q` is past `o` (committed offsets only move forward
and stop at the lowest message still being handled). A topic that no group consumes yet keeps
every message: the group that will consume it has not started.

What offsets cannot show (a group not started yet reads a topic from its oldest kept message;
`born_at` is the sender's clock; an operator looking for a message just sent) is why
`ckit mq purge` refuses windows under `PURGE_FLOOR` unless forced.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa

from consumer_kit.core.progress import committed_on_error, counted
from consumer_kit.core.schema import MqTables
from consumer_kit.transports.sql.database import Database

#: The shortest `--older-than` `ckit mq purge` accepts without `--force`.
PURGE_FLOOR = dt.timedelta(hours=1)

QueueKey = tuple[str, int]


@dataclasses.dataclass
class PurgeResult:
    """What a purge deleted and what it kept, and why."""

    deleted: int = 0
    #: messages stored before the horizon kept because a group has not consumed them, per topic
    kept: dict[str, int] = dataclasses.field(default_factory=dict)
    #: per topic with kept messages: the groups that have not consumed them
    behind: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: topics no group consumes yet (every message kept)
    unconsumed_topics: list[str] = dataclasses.field(default_factory=list)

    @property
    def kept_total(self) -> int:
        """Messages past the horizon that were kept."""
        return sum(self.kept.values())

    def to_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return {"deleted": self.deleted, "kept": self.kept_total, "kept_by_topic": self.kept,
                "groups_behind": self.behind, "unconsumed_topics": self.unconsumed_topics}


def purge(db: Database, tables: MqTables, before: dt.datetime, *, batch: int) -> PurgeResult:
    """Delete queued messages born before `before` (naive UTC) that every group known for
    their topic has consumed, `batch` rows per statement. Scheduled messages (a delay or a
    retry back-off, no offset yet) are kept."""
    m = tables.message
    old = db.run(lambda conn: conn.execute(
        sa.select(m.c.topic, m.c.queue_id, sa.func.count())
        .where(m.c.born_at < before, m.c.queue_offset.is_not(None))
        .group_by(m.c.topic, m.c.queue_id)).all(), write=False, what="count old messages")
    if not old:
        return PurgeResult()
    groups, committed = _progress(db, tables)
    result = PurgeResult()
    with committed_on_error(lambda: counted(result.deleted, "message", "deleted")):
        _purge_queues(db, tables, before, batch, old, groups, committed, result)
    return result


def _purge_queues(db: Database, tables: MqTables, before: dt.datetime, batch: int,
                  old: Sequence[sa.Row], groups: dict[str, set[str]],
                  committed: dict[tuple[str, str, int], int], result: PurgeResult) -> None:
    """`purge` queue by queue, counting into `result` batch by batch."""
    for topic, queue_id, count in sorted(old):
        key = (str(topic), int(queue_id))
        known = groups.get(key[0])
        if not known:
            if key[0] not in result.unconsumed_topics:
                result.unconsumed_topics.append(key[0])
            result.kept[key[0]] = result.kept.get(key[0], 0) + int(count)
            continue
        floor = min(committed.get((group, *key), 0) for group in known)
        before_queue = result.deleted
        _delete_below(db, tables, key, floor, before, batch, result)
        left = int(count) - (result.deleted - before_queue)
        if left > 0:
            result.kept[key[0]] = result.kept.get(key[0], 0) + left
            last = _last_old_offset(db, tables, key, before)
            behind = sorted(g for g in known if committed.get((g, *key), 0) <= last)
            result.behind[key[0]] = sorted({*result.behind.get(key[0], []), *behind})


def _progress(db: Database, tables: MqTables
              ) -> tuple[dict[str, set[str]], dict[tuple[str, str, int], int]]:
    """The groups known for each topic, and every committed offset (group, topic, queue)."""
    off, lease = tables.offset, tables.lease

    def read(conn: sa.Connection) -> tuple[list[sa.Row], list[sa.Row]]:
        offsets = conn.execute(sa.select(off.c.consumer_group, off.c.topic, off.c.queue_id,
                                         off.c.committed_offset)).all()
        leases = conn.execute(sa.select(lease.c.consumer_group, lease.c.topic).distinct()).all()
        return list(offsets), list(leases)

    offsets, leases = db.run(read, write=False, what="read consumer offsets")
    groups: dict[str, set[str]] = defaultdict(set)
    committed: dict[tuple[str, str, int], int] = {}
    for group, topic, queue_id, offset in offsets:
        groups[str(topic)].add(str(group))
        committed[(str(group), str(topic), int(queue_id))] = int(offset)
    for group, topic in leases:
        groups[str(topic)].add(str(group))
    return groups, committed


def _delete_below(db: Database, tables: MqTables, key: QueueKey, floor: int,
                  before: dt.datetime, batch: int, result: PurgeResult) -> None:
    """Delete the messages of one queue below `floor` and born before `before`, adding each
    committed batch to `result.deleted`."""
    m = tables.message
    where = (m.c.topic == key[0], m.c.queue_id == key[1], m.c.queue_offset < floor,
             m.c.born_at < before)
    while floor > 0:
        ids = db.run(lambda conn: conn.execute(
            sa.select(m.c.id).where(*where).order_by(m.c.queue_offset).limit(batch)
        ).scalars().all(), write=False, what="find consumed messages")
        if not ids:
            break
        result.deleted += db.run(functools.partial(_delete_ids, table=m, ids=list(ids)),
                                 write=True, what="purge")


def _delete_ids(conn: sa.Connection, *, table: sa.Table, ids: list[int]) -> int:
    return int(conn.execute(sa.delete(table).where(table.c.id.in_(ids))).rowcount)


def _last_old_offset(db: Database, tables: MqTables, key: QueueKey, before: dt.datetime) -> int:
    m = tables.message
    last = db.run(lambda conn: conn.execute(
        sa.select(sa.func.max(m.c.queue_offset)).where(
            m.c.topic == key[0], m.c.queue_id == key[1], m.c.born_at < before,
            m.c.queue_offset.is_not(None))).scalar(), write=False, what="read the last offset")
    return int(last) if last is not None else -1
