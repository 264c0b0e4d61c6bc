"""Whether a caller's connection commits each statement on its own.

`publish` writes the outbox row in the caller's transaction: that is the whole promise of a
transactional outbox. On a connection in autocommit (SQLAlchemy's `isolation_level="AUTOCOMMIT"`,
or the driver's own autocommit switched on), `engine.begin()` sends no BEGIN, so the row would
commit the moment it is written, whatever then happens to the business change beside it: a
message about a change that was rolled back. Such a connection is refused before anything is
written.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection


def commits_each_statement(conn: Connection) -> bool:
    """True when `conn`'s driver connection is in autocommit: a statement sent on it now would
    be committed alone.

    SQLite's driver has no autocommit switch of its own before Python 3.12: SQLAlchemy's
    AUTOCOMMIT sets its `isolation_level` to None. The same None is how code that sends its
    own BEGIN (SQLAlchemy's recipe for SQLite transactions) runs, so there a connection counts
    as autocommit only when no transaction is open on it either. A dialect that cannot tell
    (no `detect_autocommit_setting`, or a driver connection without the attribute it reads)
    counts as not autocommit.
    """
    raw = conn.connection.dbapi_connection
    if raw is None:
        return False
    if conn.dialect.name == "sqlite":
        return (getattr(raw, "isolation_level", "") is None
                and not getattr(raw, "in_transaction", True))
    detect = getattr(conn.dialect, "detect_autocommit_setting", None)
    if detect is None:
        return False
    try:
        return bool(detect(raw))
    except AttributeError:  # a driver connection without the attribute: it cannot tell
        return False
