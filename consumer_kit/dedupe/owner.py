"""Which processed table a group's Redis keys stand for: two databases behind one group name
(staging and production sharing a Redis database) would read each other's done markers, and a
message one of them finished would be acked by the other as a duplicate, never run there.

Checked once at start (`ConsumerApp.check`), never per message: each start records where its
processed rows are (no user, no password) under `owner_key`, kept as long as a done marker, and
warns when the record it replaces names another database.
"""

from __future__ import annotations

import datetime as dt
import logging
import os

import redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from consumer_kit.dedupe.keys import owner_key

log = logging.getLogger(__name__)


def store_identity(engine: Engine, table: str) -> str:
    """Where a group's processed rows are, as the database server says (the same through any
    host name or proxy, and on every node of a Galera cluster): `backend server/database
    table`; a SQLite file by its absolute path. Never a user or a password. A server that does
    not say is named by the URL's host, port and database."""
    url, backend = engine.url, engine.url.get_backend_name()
    if backend == "sqlite":
        path = url.database or ":memory:"
        where = path if path == ":memory:" or path.startswith("file:") else os.path.abspath(path)
        return f"sqlite {where} {table}"
    try:
        with engine.connect() as conn:
            if backend == "mysql":
                row = conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE "
                                           "'wsrep_cluster_state_uuid'").first()
                server = (f"galera cluster {row[1]}" if row is not None and row[1] else
                          "{}:{}".format(*conn.exec_driver_sql("SELECT @@hostname, @@port").one()))
            elif backend == "postgresql":
                server = "system {}".format(conn.exec_driver_sql(
                    "SELECT system_identifier FROM pg_control_system()").scalar())
            else:
                server = f"{url.host}:{url.port}"
    except SQLAlchemyError as exc:  # named by its URL then: said why, at debug level
        log.debug("processed database %s: server identity not read (%s)", table, exc)
        server = f"{url.host}:{url.port}"
    return f"{backend} {server}/{url.database} {table}"


def check_owner(client: redis.Redis, group: str, identity: str, keep: dt.timedelta) -> None:
    """Record `identity` as the processed table of `group`'s keys in this Redis database (for
    `keep`, the done markers' lifetime), and warn when another was recorded. A Redis that
    refuses (down, an ACL allowing our scripts only) is no reason not to start: said at debug
    level."""
    key = owner_key(group)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("GET", key)
        # the TTL as text: no number reaches hiredis's packer (`consumer_kit.dedupe.packer`)
        pipe.execute_command("SET", key, identity, "PX", str(int(keep.total_seconds() * 1000)))
        before, _ = pipe.execute()
    except redis.RedisError as exc:
        log.debug("group %s: the owner of its redis keys not checked: %s", group, exc)
        return
    if isinstance(before, bytes):
        before = before.decode("utf-8", "replace")
    if before is not None and before != identity:
        log.warning("group %s: its redis keys were last used by consumers whose processed rows "
                    "are in %s, these are in %s: if those are two databases (two environments "
                    "sharing a redis database), a message one of them finished is a duplicate "
                    "to the other, acked and never run there. Give each its own redis database "
                    "(redis://host:port/N); if both name one database, ignore this",
                    group, before, identity)
