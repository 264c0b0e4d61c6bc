"""How every operator command reads a row argument (`show`, `retry`, `suspend`, `resume`).

An argument is one of

- `id:N`         the row with id N
- `msg:ID`       the row with message id ID
- `biz:KEY`      the rows with biz key KEY (any biz type); `biz:TYPE:KEY` for one type (a key
                 holding `:` is read both ways: `biz:tenant7:42` is type `tenant7`, key `42`
                 and key `tenant7:42`; rows found both ways are refused, naming their ids)
- a bare value   whichever of the three above it matches; when it matches in more than one way
                 (a row id that is also some row's biz key, say) the command refuses it and
                 says which prefix picks what, so `show 1` and `resume 1` never act on
                 different rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from consumer_kit.core.errors import AmbiguousTarget

PREFIXES = ("id:", "msg:", "biz:")


def resolve(conn: Connection, outbox: sa.Table, ident: str,
            columns: Sequence[Any] | None = None) -> list[Any]:
    """The rows `ident` names (empty: none), with `columns` (default: every column).

    Raises:
        AmbiguousTarget: a bare value matches rows in more than one way.
    """
    c = outbox.c
    select = sa.select(*(columns or [outbox]))
    text = str(ident).strip()
    if text.startswith("id:"):
        number = text[3:]
        if not _row_id(number):
            raise AmbiguousTarget(f"{ident!r}: id: needs a row id (digits 0-9), e.g. id:42")
        return list(conn.execute(select.where(c.id == int(number))).all())
    if text.startswith("msg:"):
        return list(conn.execute(select.where(c.message_id == text[4:])).all())
    if text.startswith("biz:"):
        return _by_biz(conn, outbox, select, text[4:])
    found = {
        "msg": list(conn.execute(select.where(c.message_id == text)).all()),
        "id": (list(conn.execute(select.where(c.id == int(text))).all())
               if _row_id(text) else []),
        "biz": _by_biz(conn, outbox, select, text, bare=True),
    }
    kinds = [kind for kind, rows in found.items() if rows]
    if len(kinds) > 1:
        choices = ", ".join(f"{k}:{text} ({len(found[k])} row{'s' * (len(found[k]) > 1)})"
                            for k in kinds)
        raise AmbiguousTarget(f"{text!r} matches rows in more than one way: say {choices}")
    return found[kinds[0]] if kinds else []


def _row_id(text: str) -> bool:
    """Whether `text` can be a row id: ASCII digits that fit a BIGINT."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _by_biz(conn: Connection, outbox: sa.Table, select: Any, spec: str, *,
            bare: bool = False) -> list[Any]:
    c = outbox.c
    any_type = _by_key(conn, outbox, select, spec)
    biz_type, sep, biz_key = spec.partition(":")
    if not sep or bare:
        return any_type
    typed = list(conn.execute(select.where(c.biz_type == biz_type, c.biz_key == biz_key)))
    if typed and any_type and {r.id for r in typed} != {r.id for r in any_type}:
        raise AmbiguousTarget(
            f"'biz:{spec}' reads two ways: type {biz_type!r} key {biz_key!r} (ids "
            f"{', '.join(str(r.id) for r in typed)}) and key {spec!r} (ids "
            f"{', '.join(str(r.id) for r in any_type)}): say id:N or msg:ID")
    return typed or any_type


def _by_key(conn: Connection, outbox: sa.Table, select: Any, key: str) -> list[Any]:
    """The rows with biz key `key`, of any biz type."""
    c = outbox.c
    # The unique (biz_type, biz_key) index leads with biz_type: list the (few) biz types first
    # (a loose index scan) so the lookup is an index range, not a table scan.
    types = list(conn.scalars(sa.select(c.biz_type).group_by(c.biz_type)))
    if not types:
        return []
    return list(conn.execute(select.where(c.biz_type.in_(types), c.biz_key == key)
                             .order_by(c.biz_type, c.id)))


def one(conn: Connection, outbox: sa.Table, ident: str, columns: Sequence[Any]) -> Any | None:
    """The one row `ident` names, or None when it names none.

    Raises:
        AmbiguousTarget: it names several rows (a biz key of several biz types) or is ambiguous.
    """
    rows = resolve(conn, outbox, ident, columns)
    if len(rows) > 1:
        raise AmbiguousTarget(f"{ident!r} names {len(rows)} rows: pick one with id:N or msg:ID "
                              f"(ids {', '.join(str(r.id) for r in rows)})")
    return rows[0] if rows else None
