"""Checks of the databases `ckit relay` and `ckit reconcile` are given, before any row moves: a
read replica beside its primary (`--read-url`), and producer databases that are one outbox
(`--url`: `outbox_producer.distinct`, which `MultiRelay` runs too)."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from consumer_kit.core.db import check_tables
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import outbox_archive_table
from consumer_kit.core.sqlite_files import check_sqlite_path
from outbox_producer.distinct import check_distinct_outboxes

log = logging.getLogger(__name__)

__all__ = ["check_distinct_outboxes", "check_replica"]


def check_replica(primary: sa.engine.Engine, replica: sa.engine.Engine, outbox: sa.Table,
                  index: int) -> None:
    """Refuse a `--read-url` that cannot serve as a copy of its `--url`: a SQLite file that is
    not there, a missing outbox table, or another database's rows (pairs go by position, so two
    swapped ones are an easy slip): the replica's first and last rows must be rows of the
    primary holding the same message ids. A replica behind its primary passes (its rows are all
    there); a row archived on the primary since (in `<outbox>_archive`) is skipped, unless no
    sampled row is left; one the primary never had (a promoted replica written to since) is not.

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
        _warn_if_primary_has_rows(primary, outbox, index)
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
    gone = {i: m for i, m in rows.items() if i not in there}
    never = sorted(set(gone.values()) - _archived(primary, outbox, list(gone.values())))
    if never:
        raise ConfigError(
            f"--read-url number {index + 1} is not a replica of --url number {index + 1}: it "
            f"holds message {never[0]}, which the primary has neither in its outbox nor in its "
            "archive (a replica is never ahead of its primary: a promoted replica written to "
            "since, or another database; rows written only there are left to no relay)")


def _archived(primary: sa.engine.Engine, outbox: sa.Table, message_ids: list[str]) -> set[str]:
    """Those of `message_ids` in the primary's `<outbox>_archive` (where `ckit outbox archive`
    and `partitions rotate` move rows; none when it has no archive)."""
    if not message_ids:
        return set()
    archive = outbox_archive_table(sa.MetaData(), f"{outbox.name}_archive")
    if not sa.inspect(primary).has_table(archive.name):
        return set()
    with primary.connect() as conn:
        return {str(m) for m in conn.execute(sa.select(archive.c.message_id).where(
            archive.c.message_id.in_(message_ids))).scalars()}


def _warn_if_primary_has_rows(primary: sa.engine.Engine, outbox: sa.Table, index: int) -> None:
    """An empty replica of a primary holding rows: another database (its rows found only by
    the primary sweep, up to `--sweep-every` late), or a replica still catching up from
    nothing. Not refused (a new replica starts empty), said once."""
    with primary.connect() as conn:
        found = conn.execute(sa.select(outbox.c.id).limit(1)).first()
    if found is not None:
        log.warning("--read-url number %d has no outbox row while --url number %d has some: if "
                    "it is not a replica still catching up, it is another database (due rows "
                    "are then found only by the primary sweep, up to --sweep-every late)",
                    index + 1, index + 1)
