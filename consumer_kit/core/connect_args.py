"""Refusing a database URL option its driver does not take, before the first connection.

SQLAlchemy hands the options of a URL's query string it does not read itself to the driver's
`connect()`. PyMySQL's takes named arguments only: `?chraset=utf8` failed at the first
connection as `TypeError: Connection.__init__() got an unexpected keyword argument`, reported as
a crash rather than as a configuration error. A driver whose `connect()` takes any keyword
(psycopg and the libpq options, SQLite) is left to say itself what it refuses, but for another
driver's TLS option (mysqlclient's `ssl_mode` on psycopg), which is refused naming what it takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.engine import URL, Engine

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.urls import mask_url

# Options of another driver a URL copied from elsewhere brings, and what this driver takes instead
_INSTEAD = {
    ("psycopg", "ssl_mode"): "psycopg takes libpq's sslmode (require, verify-full, ...) "
                             "instead of mysqlclient's ssl_mode",
    ("pg8000", "sslmode"): "pg8000 takes an ssl.SSLContext as create_engine(connect_args="
                           "{'ssl_context': ...}) instead of libpq's sslmode",
    ("pymysql", "ssl_mode"): "PyMySQL takes ssl_ca, ssl_cert, ssl_key and ssl_verify_cert "
                             "instead of mysqlclient's ssl_mode",
    ("pymysql", "sslmode"): "PyMySQL takes ssl_ca, ssl_cert, ssl_key and ssl_verify_cert "
                            "instead of libpq's sslmode",
}


def unknown_options(connect: Callable[..., Any], names: Iterable[str]) -> list[str]:
    """Those of `names` that `connect` takes no keyword for (none when it takes any keyword
    or its signature cannot be read).

    >>> def connect(host=None, port=0): ...
    >>> unknown_options(connect, ["port", "chraset"]), unknown_options(lambda **kw: 0, ["x"])
    (['chraset'], [])
    """
    try:
        parameters = inspect.signature(connect).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the driver will say
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return []
    taken = {p.name for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return sorted(name for name in names if name not in taken)


def bad_value(url: URL, exc: Exception) -> ConfigError:
    """The error for a URL option whose value the dialect could not read (`?connect_timeout=abc`:
    its `int()`), raised by `create_engine` or `create_connect_args`."""
    return ConfigError(f"database URL {mask_url(url.render_as_string())!r}: an option's value "
                       f"is not one {url.get_driver_name()} takes ({type(exc).__name__}: {exc})")


def check_connect_args(engine: Engine) -> None:
    """Refuse `engine` when its URL gives its driver's `connect()` an option it does not take.

    Raises:
        ConfigError: naming the options (or the value the dialect could not read), the driver
            and the URL (its password masked).
    """
    dialect = engine.dialect
    try:
        _, params = dialect.create_connect_args(engine.url)
    except (TypeError, ValueError) as exc:
        raise bad_value(engine.url, exc) from None
    dbapi = dialect.dbapi if dialect.dbapi is not None else dialect.import_dbapi()
    connect = getattr(dbapi, "connect", None)
    if connect is None:
        return
    unknown = unknown_options(connect.__init__ if inspect.isclass(connect) else connect, params)
    unknown += [name for name in params  # (a connect() of any keyword: its libpq says the rest)
                if (dialect.driver, name) in _INSTEAD and name not in unknown]
    if unknown:
        listed = ", ".join(repr(name) for name in unknown)
        instead = [_INSTEAD[dialect.driver, name] for name in unknown
                   if (dialect.driver, name) in _INSTEAD]
        why = "; ".join(instead) if instead else "misspelt, or an option of another driver"
        raise ConfigError(f"database URL {mask_url(engine.url.render_as_string())!r}: "
                          f"{dialect.driver} takes no option {listed} ({why})")
