"""Checks of the databases `ckit relay` and `ckit reconcile` are given, before any row moves: a
read replica beside its primary (`--read-url`), and producer databases that are one outbox
(`--url`)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from consumer_kit.core.db import check_sqlite_path, check_tables
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.urls import mask_url


def check_replica(primary: sa.engine.Engine, replica: sa.engine.Engine, outbox: sa.Table,
                  index: int) -> None:
    """Refuse a `--read-url` that cannot serve as a copy of its `--url`: a SQLite file that is
    not there, a missing outbox table, or another database's rows (pairs go by position, so two
    swapped ones are an easy slip): the replica's first and last rows must be rows of the
    primary holding the same message ids. A replica behind its primary passes (its rows are all
    there); a row archived on the primary since is skipped, unless no sampled row is left.

    Raises:
        ConfigError: the replica is not there or holds other rows.
        SchemaError: its outbox table is missing.
    """
    if replica.dialect.name == "sqlite":
        try:
            check_sqlite_path(replica.url.database, replica.url.query, must_exist=True)
        except ConfigError as exc:
            raise ConfigError(f"--read-url number {index + 1}: {exc}") from None
    check_tables(replica, outbox)
    with replica.connect() as conn:
        samples = [conn.execute(sa.select(outbox.c.id, outbox.c.message_id)
                                .order_by(order).limit(1)).first()
                   for order in (outbox.c.id.desc(), outbox.c.id.asc())]
    rows = {int(r.id): r.message_id for r in samples if r is not None}
    if not rows:
        return
    with primary.connect() as conn:
        there: dict[int, str] = {int(r.id): r.message_id for r in conn.execute(
            sa.select(outbox.c.id, outbox.c.message_id).where(outbox.c.id.in_(list(rows))))}
    wrong = [(i, m, there[i]) for i, m in rows.items() if i in there and there[i] != m]
    if wrong or not there:
        i, m, other = wrong[0] if wrong else (next(iter(rows)), next(iter(rows.values())), None)
        raise ConfigError(
            f"--read-url number {index + 1} is not a replica of --url number {index + 1}: its row "
            f"id {i} is message {m}, {'message ' + other if other else 'not there'} on the "
            "primary (the two lists pair by position: same order for both)")


def check_distinct_outboxes(engines: Sequence[sa.engine.Engine], outbox: sa.Table, *,
                            harm: str = "its rows would be sent twice") -> None:
    """Refuse two `--url`s that hold one outbox: one database named twice in two spellings
    (`localhost` and `127.0.0.1`, a default port written out), or a copy of a shard given as
    another (a writable replica, a restored backup), whose rows a relay would send a second
    time (and reconcile repair, and count, twice: `harm` says which). Message ids are unique
    across shards, so each database's newest message id is looked up in every other one (by
    its unique index): a copy that lags its source still holds the source's older rows. An
    empty outbox shares nothing and passes. It runs once, at start, on the newest rows: a copy
    written to since it was made (each newest row its own), or one whose newest row the source
    has archived since, is not caught.

    Raises:
        ConfigError: naming both `--url`s and the message id they share.
    """
    newest: dict[str, int] = {}  # each outbox's newest message id -> its --url index
    for i, engine in enumerate(engines):
        with engine.connect() as conn:
            found = conn.execute(sa.select(outbox.c.message_id)
                                 .order_by(outbox.c.id.desc()).limit(1)).scalar()
        if found is not None:
            newest.setdefault(found, i)
    for j, engine in enumerate(engines):  # one lookup per database, by the unique index
        others = [m for m, i in newest.items() if i != j]
        if not others:
            continue
        with engine.connect() as conn:
            shared = conn.execute(sa.select(outbox.c.message_id)
                                  .where(outbox.c.message_id.in_(others)).limit(1)).scalar()
        if shared is not None:
            first, second = sorted((newest[shared], j))
            raise ConfigError(
                f"--url number {second + 1} ({mask_url(str(engines[second].url))}) holds "
                f"the outbox of --url number {first + 1} "
                f"({mask_url(str(engines[first].url))}): message {shared} is in both "
                "(one database named twice, or a copy of it such as a replica given as a "
                f"shard); {harm}")
