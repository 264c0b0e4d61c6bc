"""JDBC plumbing for the Spark reconciler: SQLAlchemy URL -> JDBC URL + properties, driver jars,
and safe SQL literals for the read-side subqueries.

Passwords travel only in the `properties` dict (never in the JDBC URL), and `JdbcSource` prints
without them, so nothing here can leak one into a log line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import glob
import os
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, sqlite
from sqlalchemy.engine import make_url

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.sqlite_files import sqlite_file
from consumer_kit.core.urls import mask_url

SQLITE_DRIVER = "org.sqlite.JDBC"
MARIADB_DRIVER = "org.mariadb.jdbc.Driver"
POSTGRES_DRIVER = "org.postgresql.Driver"
JAVA_DIR = "/usr/share/java"
JAR_PATTERNS = {"mysql": "mariadb-java-client*.jar", "sqlite": "sqlite-jdbc*.jar",
                "postgresql": "postgresql.jar"}
JARS_ENV = "CKIT_JDBC_JARS"
DEFAULT_FETCH_SIZE = 10_000

#: URL query keys the JDBC reads honour as the Python driver does: libpq's name -> pgJDBC's
#: property (`options` carries a `search_path`: without it the reads go to another schema)
_PASSED_ON = {"postgresql": {"options": "options", "sslmode": "sslmode",
                             "sslrootcert": "sslrootcert", "sslcert": "sslcert",
                             "sslkey": "sslkey"}}
#: query keys that change nothing a read returns (credentials are taken by `_credentials`)
_HARMLESS = {"user", "username", "password", "passwd", "pwd", "charset", "binary_prefix",
             "client_encoding", "application_name", "connect_timeout", "read_timeout",
             "write_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
             "keepalives_count"}

#: Text that may go into a quoted SQL literal as is: printable ASCII without quotes/backslashes.
_SAFE_LITERAL = re.compile(r"^[\x20-\x26\x28-\x5b\x5d-\x7e]*$")


@dataclasses.dataclass(frozen=True)
class JdbcSource:
    """A database as Spark's JDBC reader wants it. `repr` never shows the password."""

    url: str
    properties: dict[str, str] = dataclasses.field(repr=False)
    dialect: str
    display: str

    def __repr__(self) -> str:
        return f"JdbcSource({self.display})"

    def options(self) -> dict[str, str]:
        """`url` + `driver` + credentials + fetch size, for `spark.read.format('jdbc')`."""
        return {"url": self.url, **self.properties}


def _credentials(url: Any) -> dict[str, str]:
    """`user` and `password` as the Python driver would take them: from the URL's userinfo, a
    `user=` / `password=` (`passwd=`, `pwd=`) query parameter overriding it, as SQLAlchemy's
    MySQL and PostgreSQL dialects do."""
    query = {k.lower(): v for k, v in url.query.items()}
    props = {}
    user = query.get("user") or query.get("username") or url.username
    if user:
        props["user"] = str(user)
    password = next((query[k] for k in ("password", "passwd", "pwd") if k in query), None)
    if password is None and url.password is not None:
        password = url.password
    if password is not None:
        props["password"] = str(password if isinstance(password, str) else password[-1])
    return props


def _passed_on(url: Any, dialect: str) -> dict[str, str]:
    """The JDBC properties of the URL's query options (`_PASSED_ON`).

    Raises:
        ConfigError: an option the JDBC reads cannot honour (a socket or `host=` in the query,
            a service file, MySQL TLS files, anything unknown): dropped, they would read
            another schema or server than the checks and the SQL engine, or go without TLS.
    """
    passed = _PASSED_ON.get(dialect, {})
    props: dict[str, str] = {}
    for key, value in url.query.items():
        if key.lower() in _HARMLESS:
            continue
        if key not in passed:
            raise ConfigError(
                f"the Spark engine cannot pass ?{key}= of {mask_url(url)} on to its JDBC "
                f"reads (they would read another schema or server, or skip TLS); use "
                f"--engine sql, or a URL without it")
        props[passed[key]] = str(value if isinstance(value, str) else value[-1])
    return props


def to_jdbc(sqlalchemy_url: str, *, fetch_size: int = DEFAULT_FETCH_SIZE) -> JdbcSource:
    """Convert a SQLAlchemy URL to a JDBC URL and connection properties.

    `sqlite:///path` -> `jdbc:sqlite:/abs/path`; `mysql+pymysql://u:pw@h:p/db` (any MySQL or
    MariaDB driver) -> `jdbc:mysql://h:p/db?permitMysqlScheme` with the MariaDB Connector/J
    driver (the `jdbc:mysql:` scheme selects Spark's MySQL dialect; Connector/J 3 accepts it only
    with `permitMysqlScheme`, 2.x ignores the flag); `postgresql+psycopg://u:pw@h:p/db` (any
    PostgreSQL driver) -> `jdbc:postgresql://h:p/db` with pgJDBC.

    Raises:
        ConfigError: in-memory SQLite (a JVM cannot share it) or an unsupported backend.

    >>> to_jdbc("mysql+pymysql://app:pw@db:3306/orders").url
    'jdbc:mysql://db:3306/orders?permitMysqlScheme'
    """
    try:
        url = make_url(sqlalchemy_url)
    except Exception as exc:
        raise ConfigError(f"invalid database URL {mask_url(sqlalchemy_url)!r}: {exc}") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        file = sqlite_file(url.database, url.query)  # the file the producer's driver opens
        if file is None:
            raise ConfigError("the Spark engine cannot read an in-memory SQLite database; "
                              "use a file (sqlite:///path) or --engine sql")
        path = file.resolve()
        return JdbcSource(url=f"jdbc:sqlite:{path}", properties={"driver": SQLITE_DRIVER},
                          dialect="sqlite", display=f"jdbc:sqlite:{path}")
    if backend in ("mysql", "mariadb"):
        host = url.host or "127.0.0.1"
        port = url.port or 3306
        jdbc_url = f"jdbc:mysql://{host}:{port}/{url.database or ''}?permitMysqlScheme"
        props = {"driver": MARIADB_DRIVER, "fetchsize": str(fetch_size), **_credentials(url),
                 **_passed_on(url, "mysql")}
        return JdbcSource(url=jdbc_url, properties=props, dialect="mysql",
                          display=f"{jdbc_url} user={props.get('user', '')}")
    if backend == "postgresql":
        host = url.host or "127.0.0.1"
        port = url.port or 5432
        jdbc_url = f"jdbc:postgresql://{host}:{port}/{url.database or ''}"
        props = {"driver": POSTGRES_DRIVER, "fetchsize": str(fetch_size), **_credentials(url),
                 **_passed_on(url, "postgresql")}
        return JdbcSource(url=jdbc_url, properties=props, dialect="postgresql",
                          display=f"{jdbc_url} user={props.get('user', '')}")
    raise ConfigError(f"the Spark engine reads SQLite, MySQL/MariaDB and PostgreSQL only, not "
                      f"{backend!r} ({mask_url(sqlalchemy_url)}); use --engine sql")


def find_jars(dialects: set[str], *, env: dict[str, str] | None = None) -> list[str]:
    """Jar files of the JDBC drivers the given dialects need.

    `CKIT_JDBC_JARS` (comma or path-separator separated) wins; else `/usr/share/java`.

    Raises:
        ConfigError: naming `scripts/jdbc.sh` when a driver jar is not found.
    """
    environ = os.environ if env is None else env
    listed = environ.get(JARS_ENV, "").strip()
    if listed:
        named = [j for j in re.split(rf"[,{re.escape(os.pathsep)}]", listed) if j.strip()]
        absent = [j for j in named if not Path(j).is_file()]
        if absent:
            raise ConfigError(f"{JARS_ENV} names missing jar(s) {absent}; run scripts/jdbc.sh")
        return named
    jars: list[str] = []
    for dialect in sorted(dialects):
        found = sorted(glob.glob(os.path.join(JAVA_DIR, JAR_PATTERNS[dialect])))
        if not found:
            raise ConfigError(
                f"no JDBC driver for {dialect} ({JAVA_DIR}/{JAR_PATTERNS[dialect]}): run "
                f"scripts/jdbc.sh (apt-installs libmariadb-java, libxerial-sqlite-jdbc-java and "
                f"libpostgresql-jdbc-java), "
                f"set {JARS_ENV}, or pass --conf spark.jars.packages=... on a cluster")
        jars.append(os.path.realpath(found[0]))
    return sorted(set(jars))


def literal(value: str) -> str | None:
    """`'value'` when it can be quoted safely in a read-side subquery, else None.

    Spark's JDBC reader takes no bind parameters, so the window subqueries carry their values
    as literals; only text without quotes, backslashes or control characters is accepted, and
    callers send anything else through SQLAlchemy with bound parameters instead.
    """
    if _SAFE_LITERAL.match(value):
        return f"'{value}'"
    return None


def require_literal(value: str, what: str) -> str:
    """`literal(value)`, or ConfigError naming `what` when it cannot be quoted safely."""
    quoted = literal(value)
    if quoted is None:
        raise ConfigError(f"{what} {value!r} has quotes, backslashes or control characters")
    return quoted


def timestamp_literal(value: dt.datetime) -> str:
    """A naive-UTC datetime as `'YYYY-MM-DD HH:MM:SS.ffffff'`: compares correctly with MariaDB
    DATETIME(6), PostgreSQL TIMESTAMP and the text SQLAlchemy stores in SQLite."""
    return f"'{value.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def compiled(select: sa.Select[Any], dialect: str, *, alias: str) -> str:
    """`(SELECT ...) alias`: a SQLAlchemy select compiled for `dialect` (`mysql`, `sqlite`)
    with its values as literals, the form Spark's JDBC `dbtable` option takes."""
    engine_dialect = mysql.dialect() if dialect == "mysql" else sqlite.dialect()
    text = str(select.compile(dialect=engine_dialect, compile_kwargs={"literal_binds": True}))
    return f"({' '.join(text.split())}) {alias}"
