"""Topics an operator names on the command line (`--expect TOPIC=g1,g2`, `--topic T`): one
that no row of the outbox nor of its archive carries, while the outbox holds rows, is taken for
a misspelt one. An empty outbox, or a topic whose rows were all archived, is no typo."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.db import any_row
from consumer_kit.core.schema import outbox_archive_table

#: topics named in a line, at most
SHOWN = 10


def unknown_topics(engine: Engine, outbox: sa.Table, topics: Iterable[str]) -> list[str]:
    """Those of `topics` that no row of `outbox` nor of its archive (`<outbox>_archive`, when
    there is one) carries, while `outbox` holds rows; none when it holds no row. One probe of
    the topic index per topic (the archive, which has none, is read only for a topic the outbox
    lacks)."""
    wanted = list(dict.fromkeys(topics))
    if not wanted or not any_row(engine, outbox):
        return []
    archive = outbox_archive_table(sa.MetaData(), f"{outbox.name}_archive")
    return [topic for topic in wanted
            if not any_row(engine, outbox, outbox.c.topic == topic)
            and not any_row(engine, archive, archive.c.topic == topic, optional=True)]


def topics_held(engine: Engine, outbox: sa.Table) -> str:
    """Up to `SHOWN` of the topics `outbox` holds, sorted, for a line ("A, B, ..."; "none")."""
    with engine.connect() as conn:
        found = sorted(str(t) for t in conn.execute(
            sa.select(outbox.c.topic).distinct().limit(SHOWN + 1)).scalars())
    if not found:
        return "none"
    return ", ".join(found[:SHOWN]) + (", ..." if len(found) > SHOWN else "")
