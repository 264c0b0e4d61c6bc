"""What `ckit reconcile` checks in the data before any row moves, beside the tables
(`check_databases`): that each `--group` names a group and a database that processed its
messages, that each topic a `--group` lists is one the outbox holds, that no group whose
receipts show it consumes a stuck topic is left out, and that each replica is recent enough to
show what is stuck.

Each mistake here is silent in the run itself: a misspelt group or a group URL pointing at
another database (or a `@TABLE` naming another table) makes every message of the window look
unprocessed (re-sent, and failed at its limit although consumed); a misspelt topic leaves the
group unexpected for the topic it meant, so its messages turn CONSUMED without it, and so do
those of a group left out (a forgotten `--group`) once the given groups processed them; a
replica that stopped applying changes hides every row stuck since, and the run reports nothing.
`--force` runs past the first three (a group that has processed nothing yet, a topic nothing was
published on yet, a group that no longer consumes a topic); a stale replica always stops the run
(reconcile against the primary instead).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from consumer_kit.core.db import any_row
from consumer_kit.core.db_clock import clock_offset
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import outbox_archive_table, processed_table
from consumer_kit.core.states import OutboxState
from consumer_kit.core.urls import mask_url
from consumer_kit.processed import PURGE_FLOOR
from consumer_kit.reconcile.model import GroupSource

#: topics named in a refusal, at most
_SHOWN = 10
#: a group's latest receipts whose messages its processed table is asked for (`check_groups`)
RECEIPTS_PROBED = 20
#: how far back those receipts go: inside `ckit processed purge`'s safety floor, so their
#: processed rows are still there (a day's margin for a receipt applied late)
RECEIPTS_LOOKBACK = PURGE_FLOOR - dt.timedelta(days=1)
#: the furthest this host's clock may be from a producer database's (`check_clock`)
CLOCK_LIMIT = dt.timedelta(minutes=5)


def check_groups(groups: Sequence[GroupSource], engines: Mapping[str, sa.engine.Engine],
                 producers: Sequence[str], outbox: sa.Table, receipts: sa.Table, *,
                 cutoff: dt.datetime, now: dt.datetime) -> None:
    """Refuse a group topic no row of any producer database's outbox or its archive holds;
    while the window (rows SENT before `cutoff`) holds messages of a group's topics, refuse
    the group when its processed table holds none of the messages its latest receipts (up to
    `RECEIPTS_PROBED` of each producer database, received since `now - RECEIPTS_LOOKBACK`)
    say it handled, or, without such receipts, when neither its processed table nor any
    producer database's receipts hold a single row of it.

    A receipt is sent only once the group's processed row is committed, and `ckit processed
    purge` keeps rows `PURGE_FLOOR`: so a processed table that holds none of the messages of
    recent receipts is another database's or another table (a group URL of the wrong
    database would otherwise pass on the receipts alone). One found is enough (a receipt
    applied late may name a row purged since). A quiet topic whose rows were archived passes
    (the archive is looked at only when the outbox has no row of the topic: a scan until the
    first row of it, the archive having no topic index), and so does a group whose processed
    rows were purged but whose older receipts remain. What is refused is a name nothing ever
    carried, and a table that does not hold what its group did.

    Raises:
        ConfigError: naming the `--group` and what to check.
    """
    archive = outbox_archive_table(sa.MetaData(), f"{outbox.name}_archive")
    for group in groups:
        for topic in group.topics:
            if not _any_row(engines, producers, outbox, outbox.c.topic == topic) and \
                    not _any_row(engines, producers, archive, archive.c.topic == topic,
                                optional=True):
                raise ConfigError(
                    f"--group {group.name}: no outbox row has topic {topic!r}, nor an archived "
                    f"one (topics there: {_topics(engines, producers, outbox)}): a misspelt "
                    f"topic leaves {group.name} unexpected for the one it meant, whose messages "
                    "then turn CONSUMED without it (--force if nothing was published on "
                    f"{topic!r} yet)")
        table = processed_table(sa.MetaData(), group.table)
        stuck = sa.and_(outbox.c.state == int(OutboxState.SENT), outbox.c.sent_at < cutoff)
        if group.topics:
            stuck = sa.and_(stuck, outbox.c.topic.in_(group.topics))
        recent = _recent_receipts(engines, producers, receipts, group.name,
                                  since=now - RECEIPTS_LOOKBACK)
        if recent:
            with engines[group.url].connect() as conn:
                held = conn.execute(sa.select(sa.literal(1)).where(
                    table.c.consumer_group == group.name,
                    table.c.message_id.in_(recent)).limit(1)).first()
            if held is None and _any_row(engines, producers, outbox, stuck):
                raise ConfigError(
                    f"--group {group.name}: {mask_url(group.url)} holds none of the "
                    f"{len(recent)} messages the latest receipts of {group.name!r} say it "
                    f"handled (e.g. {recent[0]}) in {group.table}, while messages of its topics "
                    "are stuck in SENT: another database or table (every message would look "
                    "unprocessed: re-sent, and failed at its limit; --force if its processed "
                    "rows were purged early)")
            continue
        with engines[group.url].connect() as conn:
            processed = conn.execute(sa.select(sa.literal(1)).where(
                table.c.consumer_group == group.name).limit(1)).first()
        if processed is not None or _any_row(engines, producers, receipts,
                                             receipts.c.consumer_group == group.name):
            continue
        if _any_row(engines, producers, outbox, stuck):
            raise ConfigError(
                f"--group {group.name}: {mask_url(group.url)} holds no processed row of group "
                f"{group.name!r} in {group.table}, no producer database a receipt of it, and "
                "messages of its topics are stuck in SENT: a misspelt group or another "
                "database (every message would look unprocessed: re-sent, and failed at its "
                "limit; --force if that is right: a new group, or one whose processed rows were "
                "purged and receipts archived)")


def check_left_out(groups: Sequence[GroupSource], engines: Mapping[str, sa.engine.Engine],
                   producers: Sequence[str], outbox: sa.Table, receipts: sa.Table, *,
                   cutoff: dt.datetime, now: dt.datetime) -> None:
    """Refuse a group left out of the `--group`s, or a `--group` whose `:TOPIC` list leaves
    out a topic, when its latest receipts (up to `RECEIPTS_PROBED` of each producer database,
    received since `now - RECEIPTS_LOOKBACK`) name messages of that topic, another given
    group expects it, and messages of it are stuck in SENT (rows SENT before `cutoff`).

    Only the groups expected count: a stuck message every given group expecting its topic
    processed is repaired CONSUMED, so the group left out (a forgotten `--group`, a topic
    missing from its list) would never get it. Groups with receipts are found by one index
    seek each (`consumer_group > last`), not a scan of the receipts.

    Raises:
        ConfigError: naming the group, the topic and what to give.
    """
    given = {g.name: g for g in groups}
    for url in producers:
        for name in _receipt_groups(engines[url], receipts):
            group = given.get(name)
            if group is not None and not group.topics:
                continue
            recent = _recent_receipts(engines, [url], receipts, name,
                                      since=now - RECEIPTS_LOOKBACK)
            if not recent:
                continue
            with engines[url].connect() as conn:
                topics = sorted(conn.execute(sa.select(outbox.c.topic).distinct().where(
                    outbox.c.message_id.in_(recent))).scalars())
            for topic in topics:
                if group is not None and group.expects(topic):
                    continue
                expecting = [g.name for g in groups if g.expects(topic)]
                stuck = sa.and_(outbox.c.state == int(OutboxState.SENT),
                                outbox.c.sent_at < cutoff, outbox.c.topic == topic)
                if not expecting or not _any_row(engines, producers, outbox, stuck):
                    continue
                who = (f"--group: {name!r} is not given" if group is None else
                       f"--group {name}: its topics ({', '.join(group.topics)}) leave out "
                       f"{topic!r}")
                fix = (f"give --group {name}=DB_URL" if group is None else
                       f"add {topic} to its topics")
                raise ConfigError(
                    f"{who}, but its receipts (e.g. {recent[0]}) show it consumes {topic!r}, "
                    f"which {', '.join(expecting)} "
                    f"{'expects' if len(expecting) == 1 else 'expect'}, and messages of "
                    f"{topic!r} are stuck in SENT: those the given groups processed would "
                    f"turn CONSUMED without {name} ({fix}; --force if {name} no longer "
                    f"consumes {topic!r})")


def check_clock(engine: sa.engine.Engine, url: str, option: str, *,
                stuck_after: dt.timedelta) -> None:
    """Refuse a host whose clock is surely further from the producer database's than
    `CLOCK_LIMIT` (or half `stuck_after`, when less): the window is judged by this host's clock
    against `sent_at` and `lease_until`, which the relays write by theirs (each kept near the
    database's, `core.db_clock`). Ahead, messages still in flight look stuck: re-sent, failed
    at their limit, live send leases taken; behind, stuck rows go unseen, and the dedupe horizon
    (`DEDUPE_HORIZON`) moves back past processed purge's floor. SQLite reads this host's
    clock: nothing to measure.

    Raises:
        ConfigError: naming the option, the offset and what to do.
    """
    offset = clock_offset(engine)
    limit = min(CLOCK_LIMIT, stuck_after / 2)
    if offset is None or not offset.beyond(limit):
        return
    raise ConfigError(
        f"{option}: {mask_url(url)}: "
        f"{offset.describe()}, more than {_span(limit)}: rows are judged stuck by this host's "
        "clock against the times the relays wrote (ahead: messages in flight re-sent and "
        "failed; behind: stuck rows unseen); synchronize the clocks (NTP)")


def _receipt_groups(engine: sa.engine.Engine, receipts: sa.Table, *,
                    most: int = 1000) -> list[str]:
    """The consumer groups with a receipt row in `receipts`, in order, at most `most`: one
    `MIN(consumer_group) WHERE consumer_group > last` each (an index seek on every dialect)."""
    names: list[str] = []
    with engine.connect() as conn:
        while len(names) < most:
            query = sa.select(sa.func.min(receipts.c.consumer_group))
            if names:
                query = query.where(receipts.c.consumer_group > names[-1])
            found = conn.execute(query).scalar()
            if found is None:
                break
            names.append(found)
    return names


def check_lag(primary: sa.engine.Engine, replica: sa.engine.Engine, outbox: sa.Table,
              index: int, *, now: dt.datetime, stuck_after: dt.timedelta) -> None:
    """Refuse a replica that lacks a row its primary made `stuck_after` or more before `now`:
    it stopped applying changes then (or lags that far), so a row stuck since is not in the
    window it shows, and the run would miss it and say nothing. A replica lacking only rows
    made since passes (a row's stuck only `stuck_after` after it was sent). It looks at
    inserts: a replica stalled on an outbox that received no row since is not seen.

    Raises:
        ConfigError: naming the `--read-url` and the row it lacks.
    """
    with replica.connect() as conn:
        last = conn.execute(sa.select(sa.func.max(outbox.c.id))).scalar()
    with primary.connect() as conn:
        missing = conn.execute(
            sa.select(outbox.c.id, outbox.c.gmt_create)
            .where(outbox.c.id > (last or 0)).order_by(outbox.c.id).limit(1)).first()
    if missing is None or now - missing.gmt_create < stuck_after:
        return
    raise ConfigError(
        f"--read-url number {index + 1} lags its primary by "
        f"{_span(now - missing.gmt_create)} or more: it lacks row id {missing.id}, "
        f"made at {missing.gmt_create}, at least --stuck-after ({_span(stuck_after)}) "
        "ago, so rows stuck since would not be seen (reconcile against the primary, or mend "
        "the replica)")


def _recent_receipts(engines: Mapping[str, sa.engine.Engine], producers: Sequence[str],
                     receipts: sa.Table, group: str, *, since: dt.datetime) -> list[str]:
    """The message ids of `group`'s latest receipts received since `since`, up to
    `RECEIPTS_PROBED` from each producer database, newest first (on the receipts' index by
    group and time)."""
    found: list[str] = []
    for url in producers:
        with engines[url].connect() as conn:
            found.extend(conn.execute(
                sa.select(receipts.c.message_id)
                .where(receipts.c.consumer_group == group, receipts.c.received_at >= since)
                .order_by(receipts.c.received_at.desc()).limit(RECEIPTS_PROBED)).scalars())
    return found


def _any_row(engines: Mapping[str, sa.engine.Engine], producers: Sequence[str],
             table: sa.Table, where: sa.ColumnElement[bool], *, optional: bool = False) -> bool:
    """Whether `table` of any producer database holds a row `where` (`db.any_row`)."""
    return any(any_row(engines[url], table, where, optional=optional) for url in producers)


def _topics(engines: Mapping[str, sa.engine.Engine], producers: Sequence[str],
            outbox: sa.Table) -> str:
    found: set[str] = set()
    for url in producers:
        with engines[url].connect() as conn:
            found.update(conn.execute(sa.select(outbox.c.topic).distinct()
                                      .limit(_SHOWN + 1)).scalars())
    names = sorted(found)
    if not names:
        return "none"
    return ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")


def _span(value: dt.timedelta) -> str:
    """`value` to the second, in its largest units ("2h 5m", "40s").

    >>> _span(dt.timedelta(hours=2, minutes=5, seconds=1.5)), _span(dt.timedelta(seconds=40))
    ('2h 5m 1s', '40s')
    """
    seconds = int(value.total_seconds())
    parts = [f"{n}{unit}" for n, unit in ((seconds // 86400, "d"), (seconds // 3600 % 24, "h"),
                                          (seconds // 60 % 60, "m"), (seconds % 60, "s")) if n]
    return " ".join(parts) or "0s"
