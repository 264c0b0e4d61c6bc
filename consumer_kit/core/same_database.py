"""Whether two engines can reach the same database: the check that a component given an engine of
its own (the after-commit `Dispatcher`) works on the database its partner writes to.

Only what the URLs prove is judged: engines sharing a pool are one database; another backend
(MySQL and MariaDB are one), SQLite file, database name, host or port is another database.
Host names are compared as written (`localhost`, `127.0.0.1` and `::1` as one), so one server
reached by two names reads as two: give both components the same engine, which is what the
message says.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, Engine

from consumer_kit.core.sqlite_files import sqlite_file
from consumer_kit.core.urls import mask_url

#: the port a URL without one reaches, per backend
_DEFAULT_PORTS = {"mysql": 3306, "postgresql": 5432}
#: query keys that place the server (libpq's host, hostaddr, port, service; MySQL's socket)
_QUERY_ADDRESS = ("host", "hostaddr", "port", "service", "unix_socket")
_LOOPBACK = {"", "localhost", "127.0.0.1", "::1", "[::1]"}


def database_mismatch(a: Engine, b: Engine) -> str | None:
    """None when `a` and `b` may reach the same database, else what differs and both URLs
    (passwords masked, in the query too), e.g. "database differs: mysql+pymysql://app:***@db/a
    and ...". What a URL does not say is not judged: an SQLite engine without a file (in
    memory, or made by a `creator`), a host or port given in the query (libpq's `?host=`).

    >>> import sqlalchemy as sa
    >>> database_mismatch(sa.create_engine("sqlite:///a.db"), sa.create_engine("sqlite:///b.db"))
    'SQLite file differs: sqlite:///a.db and sqlite:///b.db'
    """
    if a is b or a.pool is b.pool:
        return None
    ua, ub = a.url, b.url
    backend = _backend(ua)
    if backend != _backend(ub):
        return _differ("backend", ua, ub)
    if backend == "sqlite":
        fa, fb = _sqlite_file(ua), _sqlite_file(ub)
        if fa is None or fb is None:
            return None
        return None if fa == fb else _differ("SQLite file", ua, ub)
    if ua.database and ub.database and ua.database != ub.database:
        return _differ("database", ua, ub)
    if any(key in url.query for url in (ua, ub) for key in _QUERY_ADDRESS):
        return None
    if _host(ua) != _host(ub):
        return _differ("host", ua, ub)
    if (ua.port or _DEFAULT_PORTS.get(backend)) != (ub.port or _DEFAULT_PORTS.get(backend)):
        return _differ("port", ua, ub)
    return None


def _backend(url: URL) -> str:
    name = url.get_backend_name()
    return "mysql" if name == "mariadb" else name  # one server, either dialect name


def _sqlite_file(url: URL) -> str | None:
    path = sqlite_file(url.database, url.query)
    return None if path is None else os.path.realpath(path)


def _host(url: URL) -> str:
    host = (url.host or "").lower()
    return "localhost" if host in _LOOPBACK else host


def _differ(what: str, a: URL, b: URL) -> str:
    return (f"{what} differs: {mask_url(a.render_as_string(hide_password=False))} and "
            f"{mask_url(b.render_as_string(hide_password=False))}")
