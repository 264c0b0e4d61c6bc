"""Engine creation and dialect facts shared by every part that talks SQL."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.connect_args import bad_value, check_connect_args
from consumer_kit.core.errors import ConfigError, SchemaError
from consumer_kit.core.network_errors import treat_socket_errors_as_disconnects
from consumer_kit.core.schema.check import (
    case_folding_tables,
    describe_missing,
    describe_other,
    missing_columns,
    other_tables,
    padding_tables,
)
from consumer_kit.core.sqlite_files import check_sqlite_path
from consumer_kit.core.urls import mask_unparsable, mask_url, remember_secrets

SQLITE_BUSY_TIMEOUT_MS = 30_000

#: The driver to name when a URL's default driver is not installed: (backend, module, URL prefix).
#: PyMySQL is a dependency of consumer-kit; the PostgreSQL ones are optional, first found wins.
DRIVER_CHOICES = (
    ("mysql", "pymysql", "mysql+pymysql://"),
    ("mariadb", "pymysql", "mariadb+pymysql://"),
    ("postgresql", "psycopg", "postgresql+psycopg://"),
    ("postgresql", "psycopg2", "postgresql+psycopg2://"),
    ("postgresql", "pg8000", "postgresql+pg8000://"),
)

log = logging.getLogger(__name__)
#: (database, table) warned about already in this process (`check_tables` runs at every start;
#: shards share table names)
_WARNED_COLLATION: set[tuple[str, str]] = set()


def make_engine(url: str | Engine, **kwargs: Any) -> Engine:
    """Return an Engine for a SQLAlchemy URL (or the engine itself).

    SQLite gets WAL mode and a busy timeout so several processes can share one file; MySQL and
    MariaDB get pre-ping and a connect timeout so a dead server fails fast; pg8000 raises a
    dropped connection as SQLAlchemy's `OperationalError` (`core.network_errors`; also on an
    engine passed in).

    Raises:
        ConfigError: the URL cannot be parsed, its driver is not installed or does not take
            one of its options.
    """
    if isinstance(url, Engine):
        if url.dialect.driver == "pg8000":  # a caller's engine: the same guard
            treat_socket_errors_as_disconnects(url)
        return url
    remember_secrets([url])
    try:
        parsed = sa.engine.make_url(url)
    except Exception as exc:
        # the parser's message quotes the URL, or a piece of the password read as a port
        raise ConfigError(f"invalid database URL {mask_unparsable(url)} ({type(exc).__name__}): "
                          "after its scheme it needs the user, password, host and port; "
                          "%-escape the at signs, colons, slashes, percent signs and spaces of "
                          "a password (CKIT_DB_URL and CKIT_READ_URL hold several URLs "
                          "separated by spaces)") from None
    if parsed.host and "@" in parsed.host:  # the password holds a raw `@`: part of it is "host"
        raise ConfigError(f"invalid database URL {mask_url(str(url))!r}: its password holds a "
                          "raw at sign; %-escape it as %40 (and a literal % as %25)")
    backend = parsed.get_backend_name()
    options: dict[str, Any] = {}
    if backend == "sqlite":
        check_sqlite_path(parsed.database, parsed.query)
        options["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    elif backend in ("mysql", "mariadb"):
        options.update(pool_pre_ping=True, pool_recycle=3600, pool_size=10, max_overflow=20)
        options["connect_args"] = {"connect_timeout": 5}
    options.update(kwargs)
    try:
        engine = sa.create_engine(parsed, **options)
    except ModuleNotFoundError as exc:
        raise ConfigError(driver_hint(parsed.drivername, exc.name or str(exc))) from None
    except sa.exc.NoSuchModuleError:
        raise ConfigError(f"unknown database in URL {mask_url(str(url))!r}: use mysql+pymysql://, "
                          "postgresql+psycopg:// or sqlite:///path") from None
    except ValueError as exc:  # an option's value the dialect reads with int() or bool()
        raise bad_value(parsed, exc) from None
    check_connect_args(engine)  # an option the driver does not take: refused before connecting
    if backend == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    elif parsed.get_driver_name() == "pg8000":  # lets a dropped connection's socket error out
        treat_socket_errors_as_disconnects(engine)
    return engine


def driver_hint(drivername: str, missing: str) -> str:
    """The one-line message for a URL whose driver module is not installed: which URL prefix to
    use instead when another driver of that database is installed, else what to install.

    >>> driver_hint("mysql", "MySQLdb")   # doctest: +ELLIPSIS
    "database driver 'MySQLdb' for mysql:// is not installed: use mysql+pymysql://..."
    """
    backend = drivername.split("+", 1)[0]
    for name, module, prefix in DRIVER_CHOICES:
        if name == backend and module != missing and importlib.util.find_spec(module):
            return (f"database driver {missing!r} for {drivername}:// is not installed: use "
                    f"{prefix}... ({module} is installed)")
    if backend == "postgresql":
        return (f"database driver {missing!r} for {drivername}:// is not installed: pip install "
                "'psycopg[binary]' and use postgresql+psycopg://...")
    return f"database driver {missing!r} for {drivername}:// is not installed"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    try:
        if not _is_memory(dbapi_conn):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _is_memory(dbapi_conn: Any) -> bool:
    cursor = dbapi_conn.cursor()
    try:
        rows = cursor.execute("PRAGMA database_list").fetchall()
        return not rows or not rows[0][2]
    finally:
        cursor.close()


def dialect_name(bind: Engine | sa.engine.Connection) -> str:
    """`mysql` (MySQL or MariaDB), `postgresql` or `sqlite`."""
    name = bind.dialect.name
    return "mysql" if name == "mariadb" else name


def supports_skip_locked(bind: Engine | sa.engine.Connection) -> bool:
    """True where `SELECT ... FOR UPDATE SKIP LOCKED` exists (MariaDB >= 10.6, MySQL 8, PG).

    On MySQL/MariaDB the answer needs the server's version: an engine that has not connected
    yet connects once to learn it (it used to answer False then, and a relay built from a URL
    fell back to the optimistic claim on MariaDB 10.11).
    """
    name = dialect_name(bind)
    if name == "postgresql":
        return True
    if name != "mysql":
        return False
    if bind.dialect.server_version_info is None and isinstance(bind, Engine):
        with bind.connect():
            pass
    info = bind.dialect.server_version_info or ()
    is_maria = getattr(bind.dialect, "is_mariadb", False)
    return tuple(info[:2]) >= ((10, 6) if is_maria else (8, 0))


def is_galera_node(engine: Engine) -> bool:
    """True when `engine` is a MySQL/MariaDB node of a Galera cluster (`wsrep_on` set globally):
    its row locks hold on that node only, and a conflicting write on another node fails at
    commit (certification), not at the lock. A server built without Galera has no `wsrep_on`."""
    if dialect_name(engine) != "mysql":
        return False
    with engine.connect() as conn:
        row = conn.exec_driver_sql("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'").first()
    return row is not None and str(row[1]).upper() in ("ON", "1")


@contextlib.contextmanager
def causal_reads(conn: sa.engine.Connection) -> Iterator[sa.engine.Connection]:
    """On a Galera node, `conn` (idle) with reads in the block that wait until the node has
    applied what the cluster committed before them (`wsrep_sync_wait = 1`: a commit on another
    node is applied here a moment after it returned there); its own setting is put back
    after."""
    before = int(conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar() or 0)
    conn.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
    conn.rollback()  # (a session setting outlives it; the block may begin its own)
    try:
        yield conn
    finally:
        try:
            conn.exec_driver_sql(f"SET SESSION wsrep_sync_wait = {before}")
            conn.rollback()
        except Exception:
            conn.invalidate()  # never back to the pool with the setting
            raise


def check_tables(engine: Engine, *tables: sa.Table) -> None:
    """Raise `SchemaError` naming `ckit db init` when any of `tables` is missing, or lacks a
    column this version writes (a table made by an older consumer-kit: every write would fail,
    and a consumer would retry each message into the dead-letter queue)."""
    inspector = sa.inspect(engine)
    missing = [t.name for t in tables if not inspector.has_table(t.name)]
    if missing:
        raise SchemaError(
            f"table(s) {', '.join(missing)} missing in {mask_url(str(engine.url))}: "
            f"run `ckit db init --url <that url>` first"
        )
    _warn_collations(engine, tables)
    lacking = missing_columns(engine, tables)
    if other := other_tables(lacking):
        raise SchemaError(f"in {mask_url(str(engine.url))}: {describe_other(other)}")
    if lacking:
        raise SchemaError(
            f"table(s) made by an older consumer-kit in {mask_url(str(engine.url))}: "
            f"{describe_missing(lacking)}: run `ckit db init --upgrade --url <that url>` "
            "(README, Upgrading from 0.1.0)")


def _warn_collations(engine: Engine, tables: Sequence[sa.Table]) -> None:
    """Warn once per process for each of `tables` whose text compares without case, or pads
    trailing spaces (MySQL/MariaDB tables made by an older consumer-kit; `db init --upgrade`
    converts them)."""
    where = mask_url(str(engine.url))
    for found, what in (
            (case_folding_tables(engine, tables), "compare text without case: ids, keys, "
             "topics and groups that differ only in case are one there"),
            (padding_tables(engine, tables), "compare ids with trailing spaces padded "
             "(utf8mb4_bin): ids and keys that differ only by trailing spaces are one there "
             "(the second message acked as a duplicate without running)")):
        new = [t for t in found if (where, t) not in _WARNED_COLLATION]
        if new:
            _WARNED_COLLATION.update((where, t) for t in new)
            log.warning("table(s) %s in %s %s (made by an older consumer-kit); run `ckit db "
                        "init --upgrade --url <that url>`", ", ".join(new), where, what)


def read_committed(engine: Engine) -> Engine:
    """The same engine (shared pool) whose transactions run at READ COMMITTED.

    The relay, dispatcher and ack applier use it for their own transactions: under InnoDB's
    default REPEATABLE READ, a `SELECT ... FOR UPDATE SKIP LOCKED` over the due-rows index
    takes gap locks that deadlock the services' own INSERTs into the outbox. READ COMMITTED
    takes no gap locks for locking reads. SQLite has no such level (and needs none).

    The level is set on each connection as it is checked out (`_set_read_committed`), and
    reset as SQLAlchemy resets it when the connection goes back to the shared pool. A failure
    to set it (a connection lost after the pool's pre-ping) raises SQLAlchemy's wrapped error,
    as every other statement's does: the engine's `isolation_level` option would set it in a
    hook that lets the driver's own error through.

    Raises:
        ConfigError: `engine` carries an `isolation_level` execution option of its own (say
            `AUTOCOMMIT`, under which a claim's row locks end with its statement): that option
            would win over READ COMMITTED on every connection.
    """
    if dialect_name(engine) not in ("mysql", "postgresql"):
        return engine
    level = engine.get_execution_options().get("isolation_level")
    if level is not None and str(level).upper() != "READ COMMITTED":
        raise ConfigError(
            f"the engine for {mask_url(str(engine.url))} runs at isolation level {level} (its "
            "execution option): give consumer-kit the engine without that option; it sets READ "
            "COMMITTED on its own connections")
    options = engine.execution_options()  # a view of the same pool, with listeners of its own
    sa.event.listen(options, "engine_connect", _set_read_committed)
    return options


def _set_read_committed(connection: sa.Connection) -> None:
    """Set READ COMMITTED on a connection just checked out. A failure is raised as any
    statement's is, by SQLAlchemy's own handler: its `DBAPIError` (`OperationalError` for a lost
    connection, with the engine's `handle_error` hooks applied, such as pg8000's bare socket
    error made one in `core.network_errors`), and a lost connection invalidates the pool's
    others too. The connection is discarded either way: its session state is unknown."""
    try:
        connection.execution_options(isolation_level="READ COMMITTED")
    except BaseException as err:  # an interrupt too: SQLAlchemy then takes it as a disconnect
        try:  # SQLAlchemy's handler, as for a statement (no public entry point takes this)
            connection._handle_dbapi_exception(err, None, None, None, None)
        finally:
            if not connection.invalidated:
                connection.invalidate()
            connection.close()


class Engines:
    """One engine per distinct database URL, made on first use (the reconciler's groups often
    share the producer's database)."""

    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}

    def get(self, url: str) -> Engine:
        """The engine for `url` (`make_engine`), created once.

        Raises:
            ConfigError: the URL cannot be parsed, its driver is not installed or does not take
            one of its options.
        """
        if url not in self._engines:
            self._engines[url] = make_engine(url)
        return self._engines[url]

    def dispose(self) -> None:
        """Close every pool."""
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()


def insert_ignoring_duplicates(conn: sa.Connection | Engine, table: sa.Table) -> Any:
    """An INSERT of `table` that skips rows whose primary key exists (two writers may race):
    ON CONFLICT DO NOTHING on PostgreSQL and SQLite, a no-op ON DUPLICATE KEY UPDATE on
    MySQL/MariaDB."""
    name = dialect_name(conn)
    if name == "mysql":
        from sqlalchemy.dialects import mysql

        first = next(iter(table.primary_key.columns))
        return mysql.insert(table).on_duplicate_key_update({first.name: first})
    if name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(table).on_conflict_do_nothing()
    if name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table).on_conflict_do_nothing()
    return sa.insert(table)


def insert_new(conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], *,
               chunk: int = 400) -> int:
    """Insert the `rows` whose primary key `table` does not hold yet, in multi-row statements
    of `chunk` rows (`insert_ignoring_duplicates`: a row another writer inserts meanwhile is
    skipped, not an error); returns how many went in.

    PostgreSQL and SQLite count only the rows inserted. MySQL and MariaDB count a duplicate
    too (SQLAlchemy's PyMySQL connections ask for found rows, so the no-op update of an
    existing row counts 1): there the keys found are left out first, by one SELECT per chunk,
    and only a row another writer inserts between that SELECT and the INSERT is counted
    twice.
    """
    keys = list(table.primary_key.columns)
    found_rows = dialect_name(conn) == "mysql"
    inserted = 0
    for start in range(0, len(rows), chunk):
        part = list(rows[start:start + chunk])
        if found_rows:
            wanted = [tuple(row[c.name] for c in keys) for row in part]
            held = set(conn.execute(sa.select(*keys).where(sa.tuple_(*keys).in_(wanted)))
                       .tuples())
            part = [row for row, key in zip(part, wanted) if key not in held]
            if not part:
                continue
        stmt = insert_ignoring_duplicates(conn, table).values(part)
        inserted += max(0, int(conn.execute(
            stmt.execution_options(preserve_rowcount=True)).rowcount))
    return inserted


def any_row(engine: Engine, table: sa.Table, where: sa.ColumnElement[bool] | None = None, *,
            optional: bool = False) -> bool:
    """Whether `table` holds a row (`where`, when given); with `optional`, a database without
    the table holds none."""
    if optional and not sa.inspect(engine).has_table(table.name):
        return False
    query = sa.select(sa.literal(1)).select_from(table)
    with engine.connect() as conn:
        return conn.execute((query if where is None else query.where(where)).limit(1)) \
            .first() is not None
