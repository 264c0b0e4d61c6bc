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
from sqlalchemy.engine import URL

from consumer_kit.dedupe.keys import owner_key

log = logging.getLogger(__name__)


def store_identity(url: URL, table: str) -> str:
    """Where a group's processed rows are: `backend://host:port/database table`, a SQLite file
    by its absolute path; never a user or a password."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        path = url.database or ":memory:"
        where = path if path == ":memory:" or path.startswith("file:") else os.path.abspath(path)
    else:
        where = f"{url.host or ''}{f':{url.port}' if url.port else ''}/{url.database or ''}"
    return f"{backend}://{where} {table}"


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
