"""psycopg cursors that count (or refuse) the INSERTs run through them, for the tests of the
paths below the cursor (`consumer_kit.core.pg_libpq`, `consumer_kit.core.pg_prepared`)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Connection


class CursorInserts:
    """Counts the INSERTs psycopg's cursors of one connection run (or refuses them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, conn: Connection) -> None:
        self.count = 0
        self.refuse = False
        raw: Any = conn.connection.dbapi_connection
        made = raw.cursor
        outer = self

        class Counting:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.inner = made(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                if str(query).lstrip().upper().startswith("INSERT"):
                    if outer.refuse:
                        raise AssertionError("an INSERT went through psycopg's cursor")
                    outer.count += 1
                return self.inner.execute(query, *args, **kwargs)

        monkeypatch.setattr(raw, "cursor", Counting)
