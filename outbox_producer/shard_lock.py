"""Relays of one outbox must agree on `--shard`'s N: 0/2 beside 1/3 leaves the rows of ids 3, 5,
9, 11 ... (`MOD(id, 2) = 1`, `MOD(id, 3) != 1`) to no relay, PENDING forever, and every relay
runs on as if all were well (the usual slip: a shard count changed on some hosts only, or a
relay of the old count still running).

`ShardAnnouncement` makes a sharded relay say its `i/N` on its database while it runs, on a
connection of its own: PostgreSQL a shared session advisory lock (key: the table's oid, as the
session's search_path finds it, and `N`, `i`), MariaDB/MySQL a named lock (`GET_LOCK`; names
per database, table, `N` and `i`). It takes its own first, then looks for a live relay of the
same outbox with another N, and refuses (before the relay's first claim), naming the session
that holds the peer's lock: a pooler in transaction mode keeps a session lock with its server
session after the relay stopped, and a host that died keeps it until the server notices.
MariaDB's named locks cannot be listed, so there the shard counts up to `MAX_PROBED` are looked
for; a relay of the same `i/N` already holding the name is a peer that agrees (a Galera
cluster's named locks are per node: relays on two nodes are not checked against each other).
SQLite (one host, one file) is not checked. A database that does not answer is asked again at
the relay's next metrics refresh (`Relay`), and a lost connection (a restart) is taken again.
"""

from __future__ import annotations

import logging
import zlib

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from consumer_kit.core.db import dialect_name
from consumer_kit.core.db_errors import describe, is_transient
from consumer_kit.core.errors import ConfigError
from outbox_producer.claim import Shard

log = logging.getLogger(__name__)

#: MariaDB/MySQL: the largest shard count a relay looks for among its peers
MAX_PROBED = 64
#: MariaDB/MySQL: named locks looked up per query
_PROBE_CHUNK = 256


class ShardAnnouncement:
    """This relay's `--shard i/N` on its database, held while it runs (the module doc)."""

    def __init__(self, engine: Engine, table: sa.Table, shard: Shard | None) -> None:
        self.engine, self.table, self.shard = engine, table, shard
        self.dialect = dialect_name(engine)
        self._conn: Connection | None = None
        self._engine: Engine | None = None
        self._held = False  # (MariaDB: a peer of the same i/N may hold the name)
        key = f"{engine.url.database or ''}.{table.schema or ''}.{table.name}"
        self._key = zlib.crc32(key.encode()) & 0x7FFFFFFF

    @property
    def active(self) -> bool:
        """Whether there is anything to announce (a shard, on a server database)."""
        return (self.shard is not None and self.dialect in ("postgresql", "mysql")
                and self.shard.total < 32768)  # (PostgreSQL's key holds N and i in 32 bits)

    def ensure(self) -> None:
        """Announce this relay's shard if it is not yet (or no longer) held, and refuse a
        live peer of another shard count. A database that does not answer is left for the
        next call.

        Raises:
            ConfigError: a relay of this outbox with another N is running (one line).
        """
        if not self.active:
            return
        if self._conn is not None and self._held:
            try:
                self._conn.exec_driver_sql("SELECT 1")  # still there (a restart drops it)
                self._conn.rollback()
                return
            except sa.exc.DBAPIError as exc:  # lost: taken again below, or at the next call
                log.debug("shard %s announcement lost: %s", self.shard, describe(exc))
                self.release()
        try:
            if self._conn is None:
                self._conn = self._own_engine().connect()
            peer = self._announce(self._conn)
        except sa.exc.DBAPIError as exc:
            self.release()
            if not is_transient(exc, self.engine.dialect.name):
                raise
            log.debug("shard %s not announced yet: %s", self.shard, describe(exc))
            return
        if peer is not None:
            self.release()
            assert self.shard is not None
            index, total, holder = peer
            raise ConfigError(
                f"--shard {self.shard.index}/{self.shard.total} refused: a relay of outbox "
                f"{self.table.name} runs with --shard {index}/{total} (its lock held by "
                f"{holder}); relays of one outbox need the same N, else the rows of some "
                "MOD(id, N) are claimed by none (stop the relays of the old N before starting "
                "those of the new)")

    def _own_engine(self) -> Engine:
        """An engine on a pool of its own, made like the relay's (same creator, connect
        events): the announcement holds its connection for the whole run, which would leave a
        caller's engine of one pooled connection none for the relay's claims."""
        if self._engine is None:
            self._engine = Engine(self.engine.pool.recreate(), self.engine.dialect,
                                  self.engine.url)
        return self._engine

    def release(self) -> None:
        """Stop announcing (closing the connection ends its locks)."""
        conn, self._conn, self._held = self._conn, None, False
        if conn is not None:
            try:
                conn.invalidate()  # never back to the pool holding a lock
                conn.close()
            except sa.exc.SQLAlchemyError as exc:
                log.debug("shard announcement: %s", exc)
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _announce(self, conn: Connection) -> tuple[int, int, str] | None:
        """Take this relay's lock, then return a live peer's `(i, N, who holds its lock)` of
        another N, if any."""
        assert self.shard is not None
        index, total = self.shard.index, self.shard.total
        if self.dialect == "postgresql":
            # the table itself, as this session's search_path finds it: two services' outboxes
            # of one name in schemas of their own are two tables
            name = ".".join(self.engine.dialect.identifier_preparer.quote(part) for part in
                            (self.table.schema, self.table.name) if part)
            oid = conn.execute(sa.text("SELECT to_regclass(:n)::oid"), {"n": name}).scalar()
            key = int(oid) & 0x7FFFFFFF if oid is not None else self._key
            self._held = bool(conn.execute(
                sa.text("SELECT pg_try_advisory_lock_shared(:k, :v)"),
                {"k": key, "v": total * 65536 + index}).scalar())
            found = conn.execute(sa.text(
                "SELECT objid, min(pid) FROM pg_locks WHERE locktype = 'advisory' AND "
                "objsubid = 2 AND classid = :k AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "GROUP BY objid"), {"k": key}).all()
            conn.rollback()  # (a session lock outlives the transaction)
            others = [(int(v) % 65536, int(v) // 65536, int(pid)) for v, pid in found
                      if int(v) // 65536 != total]
            if not others:
                return None
            i, n, pid = min(others, key=lambda p: p[1])
            return i, n, (f"PostgreSQL backend pid {pid}: if no relay runs there (a pooler kept "
                          f"its session, a host died), SELECT pg_terminate_backend({pid})")
        self._held = conn.execute(sa.text("SELECT GET_LOCK(:name, 0)"),
                                  {"name": self._name(total, index)}).scalar() == 1
        names = [(i, n) for n in range(1, MAX_PROBED + 1) if n != total for i in range(n)]
        for start in range(0, len(names), _PROBE_CHUNK):
            chunk = names[start:start + _PROBE_CHUNK]
            used = conn.execute(sa.text("SELECT " + ", ".join(
                f"IS_USED_LOCK(:n{k})" for k in range(len(chunk)))),
                {f"n{k}": self._name(n, i) for k, (i, n) in enumerate(chunk)}).one()
            for (i, n), holder in zip(chunk, used):
                if holder is not None:
                    conn.rollback()
                    return i, n, (f"connection {holder}: if no relay runs there (a host died), "
                                  f"KILL {holder}")
        conn.rollback()
        return None

    def _name(self, total: int, index: int) -> str:
        return f"ckit-shard-{self._key:08x}-{total}-{index}"
