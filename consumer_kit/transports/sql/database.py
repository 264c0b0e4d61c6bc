"""The SQL transport's database access: engines tuned per dialect, and short transactions retried
on transient errors and translated into the library's errors at the transaction boundary.

SQLite: WAL journal (readers never block the writer), `busy_timeout`, and `BEGIN IMMEDIATE` for
write transactions so that two processes never both read and then fail to upgrade to a write lock.
MariaDB/MySQL: READ COMMITTED (no gap locks; every poll sees the latest commits), pre-ping.
PostgreSQL: its default READ COMMITTED; errors are told apart by SQLSTATE.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event, exc

from consumer_kit.core.db import driver_hint
from consumer_kit.core.db_errors import is_duplicate, is_missing_table, is_transient
from consumer_kit.core.errors import (
    ConfigError,
    DuplicateKey,
    MessageTooLarge,
    SchemaError,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.network_errors import treat_socket_errors_as_disconnects
from consumer_kit.core.schema import DEFAULT_MQ_PREFIX, MqTables
from consumer_kit.core.sqlite_files import check_sqlite_path, sqlite_file
from consumer_kit.core.urls import mask_text, mask_url

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT = 5.0
DEFAULT_UNAVAILABLE_AFTER = 30.0
SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: bytes the MySQL drivers send as two (a backslash escape) inside a statement's literal
MYSQL_ESCAPED = (b"\0", b"\n", b"\r", b"\x1a", b"'", b'"', b"\\")
#: room in a statement for its text and every column but the body and the properties
STATEMENT_SLACK = 16 * 1024

class Database:
    """One engine and the retry policy around it. Thread-safe."""

    def __init__(
        self,
        url: str,
        tables: MqTables,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        unavailable_after: float = DEFAULT_UNAVAILABLE_AFTER,
        sqlite_synchronous: str = "FULL",
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            parsed = sa.make_url(url)
        except exc.ArgumentError as error:
            raise ConfigError(f"invalid database URL {mask_url(url)!r} for the SQL transport: "
                              "use sql+sqlite:///path.db or sql+mysql+pymysql://...") from error
        self.masked_url = mask_url(url)
        self.tables = tables
        self.unavailable_after = unavailable_after
        self.dialect = parsed.get_backend_name()
        options: dict[str, Any] = {}
        if self.dialect == "sqlite":
            if sqlite_file(parsed.database, parsed.query) is None or "mode=memory" in str(parsed):
                raise ConfigError("the SQL transport needs a SQLite file shared by its threads "
                                  "and processes: use sql+sqlite:///path/to/ckit-mq.db")
            check_sqlite_path(parsed.database, parsed.query)  # its folder is there
            sync = sqlite_synchronous.upper()
            if sync not in SQLITE_SYNCHRONOUS:
                raise ConfigError(f"sqlite_synchronous must be one of {SQLITE_SYNCHRONOUS}")
            options.update(pool_size=8, max_overflow=24, connect_args={"check_same_thread": False})
        elif self.dialect in ("mysql", "mariadb"):
            # No pre-ping (a round trip per transaction): a stale pooled connection fails on the
            # first statement, before anything was written, and `run` retries on a fresh one.
            options.update(isolation_level="READ COMMITTED", pool_size=8, max_overflow=24,
                           pool_recycle=1800)
        options.update(engine_options or {})
        try:
            self.engine = sa.create_engine(parsed, **options)
        except ModuleNotFoundError as error:
            hint = driver_hint(parsed.drivername, error.name or str(error)).replace(
                ": use ", ": use sql+", 1)  # the transport URL keeps its sql+ prefix
            raise ConfigError(f"cannot open sql+{self.masked_url}: {hint}") from None
        except (exc.ArgumentError, ImportError) as error:
            raise ConfigError(f"cannot open {self.masked_url}: {error}") from error
        if parsed.get_driver_name() == "pg8000":  # its dropped connection: a disconnect
            treat_socket_errors_as_disconnects(self.engine)
        # SQLite has one writer: threads of this process queue on a lock instead of spinning in
        # SQLite's busy handler (which sleeps up to 100 ms per try); other processes still do.
        self._write_lock: threading.Lock | None = None
        if self.dialect == "sqlite":
            _configure_sqlite(self.engine, busy_timeout, sqlite_synchronous.upper())
            self.writer: sa.Engine = self.engine.execution_options(ckit_immediate=True)
            self._write_lock = threading.Lock()
        else:
            self.writer = self.engine
        self._max_packet: int | None = None  # MySQL/MariaDB: @@max_allowed_packet, once read

    @property
    def is_sqlite(self) -> bool:
        """True on SQLite (one writer at a time; `FOR UPDATE` is a no-op there)."""
        return self.dialect == "sqlite"

    def run(self, work: Callable[[sa.Connection], T], *, write: bool, what: str) -> T:
        """Run `work` in one transaction, retrying transient errors with back-off.

        Raises:
            SchemaError: a transport table is missing.
            DuplicateKey: a primary key or unique index was already taken (never retried).
            TransportUnavailable: still failing after `unavailable_after` seconds.
            TransportError: any other database error.
        """
        deadline = time.monotonic() + self.unavailable_after
        delay = 0.005
        attempt = 0
        while True:
            attempt += 1
            try:
                if write and self._write_lock is not None:
                    with self._write_lock, self.writer.begin() as conn:
                        return work(conn)
                with (self.writer if write else self.engine).begin() as conn:
                    return work(conn)
            except exc.DBAPIError as error:
                if self._is_missing_table(error):
                    raise self.schema_error(str(error.orig)) from error
                if self._is_duplicate(error):
                    raise DuplicateKey(
                        f"SQL transport could not {what} on {self.masked_url}: "
                        f"{mask_text(str(error.orig))}"
                    ) from error
                if not self._is_transient(error):
                    raise TransportError(
                        f"SQL transport failed to {what} on {self.masked_url}: "
                        f"{mask_text(str(error.orig))}"
                    ) from error
                if time.monotonic() + delay > deadline:
                    raise TransportUnavailable(
                        f"SQL transport database {self.masked_url} unavailable for "
                        f"{self.unavailable_after:g}s ({attempt} attempts to {what}): "
                        f"{mask_text(str(error.orig))}"
                    ) from error
                if attempt in (3, 30, 300):
                    log.info("retrying %s on %s after: %s", what, self.masked_url,
                             mask_text(str(error.orig)))
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    def check_statement_size(self, body: bytes, properties: Mapping[str, str],
                             text_chars: int) -> None:
        """On MySQL/MariaDB, refuse a message whose insert would exceed the server's
        `max_allowed_packet` (the body as the driver escapes it, the properties' JSON and
        `text_chars` characters of tags and keys, escaped): the server drops the connection,
        which looked like an outage (retried for `unavailable_after` seconds, then
        TransportUnavailable) instead of this message's fault.

        Raises:
            MessageTooLarge: the statement would not fit.
        """
        if self.dialect not in ("mysql", "mariadb"):
            return
        if self._max_packet is None:
            self._max_packet = int(self.run(lambda conn: conn.exec_driver_sql(
                "SELECT @@max_allowed_packet").scalar_one(), write=False,
                what="read max_allowed_packet"))
        # at most: a tag or key character 4 UTF-8 bytes, a property's 12 in JSON; doubled
        bound = 8 * text_chars + 24 * sum(len(k) + len(v) + 6 for k, v in properties.items())
        if 2 * len(body) + bound + STATEMENT_SLACK <= self._max_packet:
            return  # fits even were every byte escaped: the common case, no pass over it
        rest = 2 * (len(json.dumps(dict(properties)).encode()) + 4 * text_chars)
        size = len(body) + sum(body.count(b) for b in MYSQL_ESCAPED) + rest + STATEMENT_SLACK
        if size > self._max_packet:
            raise MessageTooLarge(f"body of {len(body)} bytes does not fit the server's "
                                  f"max_allowed_packet of {self._max_packet} bytes (about "
                                  f"{size} with escaping and the other columns): raise "
                                  "max_allowed_packet or lower max_body_bytes")

    def schema_error(self, detail: str) -> SchemaError:
        """The error for missing tables, saying which command creates them."""
        prefix = self.tables.prefix
        which = "" if prefix == DEFAULT_MQ_PREFIX else f" (table prefix {prefix!r})"
        return SchemaError(
            f"the SQL transport's tables are missing{which}: {mask_text(detail)}; "
            f"run `ckit db init --url {self.masked_url}` (or pass create_tables=True)"
        )

    def check_schema(self, *, create: bool) -> None:
        """Create the tables (`create`) or check that they exist.

        Raises:
            SchemaError: a table is missing and `create` is false.
            TransportUnavailable: the database cannot be reached.
        """

        def check(conn: sa.Connection) -> list[str]:
            inspector = sa.inspect(conn)
            return [t.name for t in self.tables.all if not inspector.has_table(t.name)]

        path = self.sqlite_path()
        if not create and path is not None and not path.exists():
            # connecting would make an empty file, left behind by a typo in the path
            raise self.schema_error(f"the SQLite file {str(path)!r} does not exist")
        missing = self.run(check, write=False, what="check the schema")
        if missing and create:
            try:
                self.tables.metadata.create_all(self.engine, checkfirst=True)
            except exc.DBAPIError as error:  # another process created them at the same time
                log.info("create_all raced: %s", mask_text(str(error.orig)))
            missing = self.run(check, write=False, what="check the schema")
        if missing:
            raise self.schema_error("missing " + ", ".join(missing))

    def sqlite_path(self) -> Path | None:
        """The SQLite file this transport keeps its tables in (None: another database)."""
        if not self.is_sqlite:
            return None
        return sqlite_file(self.engine.url.database, self.engine.url.query)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def _is_missing_table(self, error: exc.DBAPIError) -> bool:
        return is_missing_table(error, self.dialect)

    def _is_duplicate(self, error: exc.DBAPIError) -> bool:
        return is_duplicate(error, self.dialect)

    def _is_transient(self, error: exc.DBAPIError) -> bool:
        return is_transient(error, self.dialect)


def _configure_sqlite(engine: sa.Engine, busy_timeout: float, synchronous: str) -> None:
    """WAL, busy timeout, and our own BEGIN (the driver's implicit BEGIN is turned off)."""
    pragmas = (
        f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}",
        "PRAGMA journal_mode = WAL",
        f"PRAGMA synchronous = {synchronous}",
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:  # fixed text: validated numbers and names only
                cursor.execute(pragma)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        immediate = conn.get_execution_options().get("ckit_immediate")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
