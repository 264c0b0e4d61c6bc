"""Producer databases that are one outbox: refused before a relay (or the reconciler) runs
them as two shards and sends (or repairs) every row twice."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa

from consumer_kit.core.db_errors import describe, is_transient
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.urls import mask_url

log = logging.getLogger(__name__)


def check_distinct_outboxes(engines: Sequence[sa.engine.Engine], outbox: sa.Table, *,
                            harm: str = "its rows would be sent twice",
                            skip_unreachable: bool = False) -> None:
    """Refuse two `--url`s that hold one outbox: one database named twice in two spellings
    (`localhost` and `127.0.0.1`, a default port written out), or a copy of a shard given as
    another (a writable replica, a restored backup), whose rows a relay would send a second
    time (and reconcile repair, and count, twice: `harm` says which). Message ids are unique
    across shards, so each database's newest message id is looked up in every other one (by
    its unique index): a copy that lags its source still holds the source's older rows. An
    empty outbox shares nothing and passes. It runs once, at start, on the newest rows: a copy
    written to since it was made (each newest row its own), or one whose newest row the source
    has archived since, is not caught. With `skip_unreachable`, a database that does not
    answer (a transient error: `core.db_errors.is_transient`) is left out of the check with a
    warning, so that one shard's outage does not stop the others from starting.

    Raises:
        ConfigError: naming both `--url`s and the message id they share.
    """
    newest: dict[str, int] = {}  # each outbox's newest message id -> its --url index
    down: set[int] = set()

    def query(i: int, statement: sa.Select[tuple[str]]) -> str | None:
        engine = engines[i]
        try:
            with engine.connect() as conn:
                return conn.execute(statement).scalar()
        except sa.exc.DBAPIError as exc:
            if not skip_unreachable or not is_transient(exc, engine.dialect.name):
                raise
            log.warning("database number %d (%s) does not answer (%s): not checked for "
                        "holding another's outbox", i + 1, mask_url(str(engine.url)),
                        describe(exc))
            down.add(i)
            return None

    for i in range(len(engines)):
        found = query(i, sa.select(outbox.c.message_id).order_by(outbox.c.id.desc()).limit(1))
        if found is not None:
            newest.setdefault(found, i)
    for j in range(len(engines)):  # one lookup per database, by the unique index
        others = [m for m, i in newest.items() if i != j]
        if not others or j in down:
            continue
        shared = query(j, sa.select(outbox.c.message_id)
                       .where(outbox.c.message_id.in_(others)).limit(1))
        if shared is not None:
            first, second = sorted((newest[shared], j))
            raise ConfigError(
                f"--url number {second + 1} ({mask_url(str(engines[second].url))}) holds "
                f"the outbox of --url number {first + 1} "
                f"({mask_url(str(engines[first].url))}): message {shared} is in both "
                "(one database named twice, or a copy of it such as a replica given as a "
                f"shard); {harm}")
