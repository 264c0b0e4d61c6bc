"""Which database errors an outage causes, told apart per dialect by the server's own codes.

Waiting out a lost connection, a server restarting, a lock timeout or a deadlock is right; a
syntax, schema, permission or integrity error stays whatever we wait, and must fail at once.
The exception class alone cannot tell them apart on MariaDB: PyMySQL raises `OperationalError`
for every server code it does not map, an unknown column (1054) or a trigger's SIGNAL (1644)
as well as a lost connection (2013) or a Galera node out of its cluster (1047). So MariaDB/MySQL
errors are judged by their code, PostgreSQL errors by their SQLSTATE, and SQLite's by their text.
"""

from __future__ import annotations

from sqlalchemy import exc

from consumer_kit.core.raised import exception_text

#: MySQL/MariaDB error codes worth retrying: lock wait timeout, deadlock, too many connections
#: (the server's, a user's MAX_USER_CONNECTIONS, the global max_user_connections), server
#: shutdown in progress, query interrupted (KILL QUERY, a shutdown), statement timeout
#: (MariaDB's max_statement_time, MySQL's max_execution_time), disk full, table full,
#: read-only (a failover), connection killed, can't connect, server gone away, lost connection,
#: client-side network error, idle session killed; behind a cluster: MySQL Group Replication's
#: certification conflict (3101, "Plugin instructed the server to rollback the current
#: transaction"), ProxySQL's "Max connect timeout reached while reaching hostgroup" (9001).
MYSQL_TRANSIENT = frozenset({1205, 1213, 1040, 1226, 1203, 1053, 1317, 1969, 3024, 1021, 1114,
                             1290, 1927, 2002, 2003, 2006, 2013, 2055, 4031, 3101, 9001})
#: A Galera node out of the Primary component, still joining, or taken out of service
#: (`wsrep_reject_queries`) answers 1047 "WSREP has not yet prepared node for application use";
#: elsewhere 1047 is "Unknown command", a client bug. So 1047 counts only with WSREP in its text.
MYSQL_GALERA_NOT_READY = 1047
MYSQL_NO_TABLE = frozenset({1146})
#: duplicate entry for a key (ER_DUP_ENTRY, ER_DUP_ENTRY_WITH_KEY_NAME, ER_DUP_KEY)
MYSQL_DUPLICATE = frozenset({1062, 1586, 1022})
#: PostgreSQL SQLSTATEs: undefined table; unique violation; worth retrying: serialization
#: failure, deadlock, lock not available, query canceled (a statement timeout,
#: pg_cancel_backend), admin/crash shutdown, cannot connect now, read-only transaction (a
#: failover), I/O error, and the classes 08 (connection exceptions) and 53 (insufficient
#: resources: disk full, out of memory, too many connections) but for 53400 (a configured
#: limit exceeded, which waiting does not change).
PG_NO_TABLE = frozenset({"42P01"})
PG_DUPLICATE = frozenset({"23505"})
PG_TRANSIENT = frozenset({"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03",
                          "25006", "58030"})
PG_TRANSIENT_CLASSES = ("08", "53")
PG_LASTING = frozenset({"53400"})
#: What a PostgreSQL server answers a connection it refuses for good (a wrong password, user or
#: database, no pg_hba.conf entry): psycopg gives such a failed connect no SQLSTATE, like one
#: refused by a server that is down, so its text tells them apart. Waiting cannot fix these.
PG_REFUSED = ("authentication failed", "no pg_hba.conf entry", "does not exist",
              "permission denied")
#: A transaction that lost to a concurrent one and was rolled back whole, so running it again is
#: safe and likely to succeed: a deadlock (1213: also a Galera certification failure or a
#: brute-force abort), MySQL Group Replication's certification conflict (3101); PostgreSQL's
#: serialization failure and deadlock.
MYSQL_CONFLICT = frozenset({1213, 3101})
PG_CONFLICT = frozenset({"40001", "40P01"})
SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy",
                    "unable to open database file", "disk i/o error", "database or disk is full")


def _orig(error: BaseException) -> BaseException:
    """The driver's own error: SQLAlchemy's wrapper's `orig`, or `error` itself when it is
    the driver's own (a caller holding a raw DB-API connection)."""
    orig = error.orig if isinstance(error, exc.DBAPIError) else None
    return orig if isinstance(orig, BaseException) else error


def describe(error: BaseException) -> str:
    """`error` in one line for a log: its class and the first line of its text, the driver's own
    for a SQLAlchemy `DBAPIError` (whose text adds the statement and a link)."""
    orig = _orig(error)
    text = exception_text(orig).strip()
    return f"{type(orig).__name__}: {text.splitlines()[0] if text else ''}"


def _is(error: BaseException, kind: type[exc.DBAPIError]) -> bool:
    """`error` is of DB-API class `kind` (`exc.OperationalError`, ...), wrapped or bare."""
    return isinstance(error, kind) or any(
        cls.__name__ == kind.__name__ for cls in type(_orig(error)).__mro__)


def driver_code(error: BaseException) -> int | None:
    """The MySQL/MariaDB error code of `error` (PyMySQL's first argument), if it has one."""
    args = getattr(_orig(error), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg 3 `sqlstate`, psycopg2 `pgcode`, pg8000 the
    `C` field of the server's error fields, its first argument)."""
    orig = _orig(error)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state is None and orig.args and isinstance(orig.args[0], dict):
        state = orig.args[0].get("C")
    return state if isinstance(state, str) else None


def is_transient(error: BaseException, dialect: str) -> bool:
    """Whether `error`, raised by a `dialect` ("sqlite", "postgresql", "mysql") database, is one
    an outage causes (worth waiting out) rather than one that waiting cannot fix. `error` is a
    SQLAlchemy `DBAPIError` or the driver's own error."""
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    text = str(_orig(error)).lower()
    if dialect == "sqlite":
        return any(marker in text for marker in SQLITE_TRANSIENT)
    if dialect == "postgresql":  # the server's SQLSTATE first: pg8000 raises a refused login
        state = sqlstate(error)  # (28000, 28P01) as an InterfaceError
        if state is None:  # no server answer (refused, reset, timed out) or a failed connect
            return ((_is(error, exc.OperationalError) or _is(error, exc.InterfaceError))
                    and not any(marker in text for marker in PG_REFUSED))
        return state in PG_TRANSIENT or (state.startswith(PG_TRANSIENT_CLASSES)
                                         and state not in PG_LASTING)
    if _is(error, exc.InterfaceError):
        return True
    code = driver_code(error)
    return code in MYSQL_TRANSIENT or (code == MYSQL_GALERA_NOT_READY and "wsrep" in text)


def is_conflict(error: BaseException, dialect: str) -> bool:
    """Whether `error` says the transaction lost to a concurrent one (a deadlock, a
    certification or serialization failure) and was rolled back: a subset of `is_transient`
    that calls for running it again at once rather than for waiting."""
    if dialect == "postgresql":
        return sqlstate(error) in PG_CONFLICT
    if dialect in ("mysql", "mariadb"):
        return driver_code(error) in MYSQL_CONFLICT
    return False


def is_missing_table(error: exc.DBAPIError, dialect: str) -> bool:
    """Whether `error` says a table does not exist."""
    if dialect == "sqlite":
        return "no such table" in str(_orig(error)).lower()
    if dialect == "postgresql":
        return sqlstate(error) in PG_NO_TABLE
    return driver_code(error) in MYSQL_NO_TABLE


def is_duplicate(error: exc.DBAPIError, dialect: str) -> bool:
    """Whether `error` is a duplicate key on insert."""
    if not isinstance(error, exc.IntegrityError):
        return False
    if dialect == "sqlite":
        return "unique constraint failed" in str(_orig(error)).lower()
    if dialect == "postgresql":
        return sqlstate(error) in PG_DUPLICATE
    return driver_code(error) in MYSQL_DUPLICATE
