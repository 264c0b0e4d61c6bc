"""The compare-and-set's row guards read rows by primary key on MariaDB, however few they are
(a one-row row-constructor IN is read there as a scan of the whole primary key, and an UPDATE
so planned locks every row of the outbox)."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from consumer_kit.core.schema import outbox_table
from consumer_kit.core.transitions import Versions, cas
from tests.conftest import Db

pytestmark = pytest.mark.mariadb


@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("with_message_ids", [False, True])
def test_a_guarded_update_of_a_few_rows_reads_them_by_primary_key(
        mariadb: Db, rows: int, with_message_ids: bool) -> None:
    # Given an outbox of 3,000 rows
    t = outbox_table(sa.MetaData(), mariadb.names.outbox)
    now = dt.datetime(2026, 1, 1)
    with mariadb.engine.begin() as conn:
        conn.execute(sa.insert(t), [
            {"message_id": f"m{i}", "biz_type": "t", "biz_key": str(i), "topic": "T",
             "body": b"{}", "state": 2, "next_retry_at": now, "gmt_create": now,
             "gmt_modified": now} for i in range(3000)])
        conn.exec_driver_sql(f"ANALYZE TABLE {t.name}").all()
    # When the compare-and-set of `rows` rows runs (on rows it will not move: a plan only)
    pairs = [(i, 99) for i in range(10, 10 + rows)]
    guard = Versions(pairs, [f"m{i - 1}" for i, _ in pairs] if with_message_ids else None)
    seen: list[tuple[str, object]] = []

    def keep(conn: object, cursor: object, statement: str, parameters: object,
             context: object, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append((statement, parameters))

    sa.event.listen(mariadb.engine, "before_cursor_execute", keep)
    try:
        with mariadb.engine.begin() as conn:
            # every row is SENT, so the state guard cannot narrow the read
            cas(conn, t, "repair_exhausted", guard, now=now)
    finally:
        sa.event.remove(mariadb.engine, "before_cursor_execute", keep)
    [(statement, parameters)] = seen
    with mariadb.engine.connect() as conn:
        plan = [dict(r._mapping) for r in
                conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)]  # type: ignore[arg-type]
    # Then it reads the rows by primary key, not the table
    assert [p["type"] for p in plan] in (["range"], ["const"], ["eq_ref"]), plan
    assert int(plan[0]["rows"]) <= rows, plan
