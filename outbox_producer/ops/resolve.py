"""How every operator command reads a row argument (`show`, `retry`, `suspend`, `resume`).

An argument is one of

- `id:N`         the row with id N
- `msg:ID`       the row with message id ID
- `biz:KEY`      the rows with biz key KEY (any biz type); `biz:TYPE:KEY` for one type
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
        if not number.isdigit():
            raise AmbiguousTarget(f"{ident!r}: id: needs digits, e.g. id:42")
        return list(conn.execute(select.where(c.id == int(number))).all())
    if text.startswith("msg:"):
        return list(conn.execute(select.where(c.message_id == text[4:])).all())
    if text.startswith("biz:"):
        return _by_biz(conn, outbox, select, text[4:])
    found = {
        "msg": list(conn.execute(select.where(c.message_id == text)).all()),
        "id": (list(conn.execute(select.where(c.id == int(text))).all())
               if text.isdigit() else []),
        "biz": _by_biz(conn, outbox, select, text, bare=True),
    }
    kinds = [kind for kind, rows in found.items() if rows]
    if len(kinds) > 1:
        choices = ", ".join(f"{k}:{text} ({len(found[k])} row{'s' * (len(found[k]) > 1)})"
                            for k in kinds)
        raise AmbiguousTarget(f"{text!r} matches rows in more than one way: say {choices}")
    return found[kinds[0]] if kinds else []


def _by_biz(conn: Connection, outbox: sa.Table, select: Any, spec: str, *,
            bare: bool = False) -> list[Any]:
    c = outbox.c
    biz_type, sep, biz_key = spec.partition(":")
    if sep and not bare:
        return list(conn.execute(select.where(c.biz_type == biz_type, c.biz_key == biz_key)))
    # The unique (biz_type, biz_key) index leads with biz_type: list the (few) biz types first
    # (a loose index scan) so the lookup is an index range, not a table scan.
    types = list(conn.scalars(sa.select(c.biz_type).group_by(c.biz_type)))
    if not types:
        return []
    return list(conn.execute(select.where(c.biz_type.in_(types), c.biz_key == spec)
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
