"""Whether two engines can reach the same database: the check that a component given an engine of
its own (the after-commit `Dispatcher`) works on the database its partner writes to.

Only what the URLs prove is judged: engines sharing a pool are one database; another backend,
SQLite file, database name, host or port is another database. Host names are compared as
written (`localhost`, `127.0.0.1` and `::1` as one), so one server reached by two names reads as
two: give both components the same engine, which is what the message says.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, Engine

#: the port a URL without one reaches, per backend
_DEFAULT_PORTS = {"mysql": 3306, "mariadb": 3306, "postgresql": 5432}
_LOOPBACK = {"", "localhost", "127.0.0.1", "::1", "[::1]"}


def database_mismatch(a: Engine, b: Engine) -> str | None:
    """None when `a` and `b` may reach the same database, else what differs and both URLs
    (passwords masked), e.g. "database differs: mysql+pymysql://app:***@db/a and ...".

    >>> import sqlalchemy as sa
    >>> database_mismatch(sa.create_engine("sqlite:///a.db"), sa.create_engine("sqlite:///b.db"))
    'SQLite file differs: sqlite:///a.db and sqlite:///b.db'
    """
    if a is b or a.pool is b.pool:
        return None
    ua, ub = a.url, b.url
    backend = ua.get_backend_name()
    if backend != ub.get_backend_name():
        return _differ("backend", ua, ub)
    if backend == "sqlite":
        fa, fb = _sqlite_file(ua), _sqlite_file(ub)
        if fa is None or fb is None:
            # in-memory: each engine (each pool) has its own database, unless the URIs name a
            # shared one, which is not judged here
            if ua.query.get("uri") or ub.query.get("uri"):
                return None
            return _differ("in-memory SQLite database (one per engine)", ua, ub)
        return None if fa == fb else _differ("SQLite file", ua, ub)
    if ua.database and ub.database and ua.database != ub.database:
        return _differ("database", ua, ub)
    if _host(ua) != _host(ub):
        return _differ("host", ua, ub)
    if (ua.port or _DEFAULT_PORTS.get(backend)) != (ub.port or _DEFAULT_PORTS.get(backend)):
        return _differ("port", ua, ub)
    return None


def _sqlite_file(url: URL) -> str | None:
    name = url.database or ""
    if name in ("", ":memory:") or name.startswith("file:") or "mode=memory" in name:
        return None
    return os.path.realpath(name)


def _host(url: URL) -> str:
    host = (url.host or "").lower()
    return "localhost" if host in _LOOPBACK else host


def _differ(what: str, a: URL, b: URL) -> str:
    return (f"{what} differs: {a.render_as_string(hide_password=True)} and "
            f"{b.render_as_string(hide_password=True)}")
