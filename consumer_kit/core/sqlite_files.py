"""Which file a SQLite URL opens, and refusing one that cannot be opened before connecting.

Connecting to SQLite makes its file when it is not there: a typo in a path is left behind as an
empty database, before the "tables are missing" error. A URL names its file by a path
(`sqlite:///orders.db`) or, with `?uri=true`, by a `file:` URI (`sqlite:///file:orders.db?
uri=true`, `file:///abs/orders.db`); without `uri=true` a `file:` name is a file of that name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from consumer_kit.core.errors import ConfigError

#: What SQLAlchemy reads as true in `?uri=` (`sqlalchemy.util.asbool`).
_TRUE = ("true", "yes", "on", "y", "t", "1")


def sqlite_file(database: str | None, query: Mapping[str, Any] | None = None) -> Path | None:
    """The file a SQLite URL's database opens, as the driver reads it, or None when it opens
    none: in memory (`:memory:`, `mode=memory`), or a temporary database (an empty name).

    >>> sqlite_file("file:/srv/mq%20a.db", {"uri": "true"}), sqlite_file("file:x.db")
    (PosixPath('/srv/mq a.db'), PosixPath('file:x.db'))
    >>> sqlite_file("file:///srv/mq.db", {"uri": "1"}), sqlite_file("file::memory:", {"uri": "1"})
    (PosixPath('/srv/mq.db'), None)
    >>> sqlite_file("~/mq.db")  # as the driver opens it: a folder named ~
    PosixPath('~/mq.db')
    """
    if not database or database == ":memory:":
        return None
    if not is_uri(query):
        return Path(database)  # `~` too is a name: the driver expands nothing
    name, _, params = database.partition("?")  # (SQLAlchemy's URL keeps them in `query`)
    options = {**dict(parse_qsl(params)), **{str(k): str(v) for k, v in (query or {}).items()}}
    if options.get("mode") == "memory" or options.get("vfs") == "memdb":
        return None
    if not name.startswith("file:"):  # in URI mode, a name that is no URI is a file name
        return Path(name)
    path = name.removeprefix("file:")
    if path.startswith("//"):  # file://host/path (SQLite takes no host but localhost)
        path = "/" + path[2:].partition("/")[2]
    path = unquote(path.partition("#")[0])
    return None if path in ("", ":memory:") else Path(path)


def is_uri(query: Mapping[str, Any] | None) -> bool:
    """Whether a SQLite URL's query makes the driver read its database as a `file:` URI."""
    return str((query or {}).get("uri", "")).strip().lower() in _TRUE


def check_sqlite_path(database: str | None, query: Mapping[str, Any] | None = None, *,
                      must_exist: bool = False) -> None:
    """Refuse a SQLite file whose folder does not exist (or that is a folder) before the driver
    answers "unable to open database file"; with `must_exist`, a file that is not there yet
    (connecting would make an empty one: a typo in a path read as a database with no tables).
    In-memory and temporary databases pass.

    Raises:
        ConfigError: naming the path and what is wrong with it.
    """
    path = sqlite_file(database, query)
    if path is None:
        return
    folder = path.resolve().parent
    if not folder.is_dir():
        hint = " (create it first)"
        if str(database).startswith("file:") and not is_uri(query):
            hint = " (a file: URI needs ?uri=true)"
        elif str(database).startswith("~"):
            hint = " (a URL does not expand ~: write the home folder's path)"
        raise ConfigError(f"SQLite database {database!r}: folder {str(folder)!r} does not exist"
                          + hint)
    if path.is_dir():
        raise ConfigError(f"SQLite database {database!r} is a folder, not a file")
    if must_exist and not path.exists():
        raise ConfigError(f"SQLite database {database} does not exist")
