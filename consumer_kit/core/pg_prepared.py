"""A statement inside a begun transaction, run under psycopg's own prepared statement, below
its cursor.

`Outbox.publish` runs its INSERT inside the caller's transaction, after the business change:
there is no BEGIN to share a round trip with (`consumer_kit.core.pg_libpq`), so the round trip
is the statement's own, and what is left to save is the Python around it. psycopg's cursor
prepares a statement once it has run it `prepare_threshold` times on a connection (5 by
default) and then sends only its EXECUTE; around that EXECUTE it still makes a cursor, asks its
prepare manager, reads the results into the cursor and runs the manager's upkeep. Skipping
that saves 0.005-0.011 ms per publish (5-10% of what the INSERT adds), interleaved with other
transactions as a service runs it (the last line of `bench/publish_floor.py` on PostgreSQL).

`run` sends the EXECUTE of the statement psycopg prepared, under psycopg's name for it, with
the parameters adapted by psycopg's own `Transformer` and query conversion (the same text,
types and formats as the cursor's; psycopg names a statement per text and types), and reads the
row count as the cursor's `rowcount` reads it (the rows returned, when any; -1 for a command
without a count). It never prepares a statement of its own: psycopg's bookkeeping decides which
statements the server holds (it forgets them all when a rollback, a `DISCARD ALL`, a
`DEALLOCATE ALL`, a `DROP` or an `ALTER` goes through it, and evicts the least used past
`prepared_max`), so a statement runs here only under a name psycopg's cursor would run it under
at that moment. Until psycopg holds the statement, `run` answers `NOT_RUN` and the cursor runs
it (and counts it towards its threshold).

A statement dropped behind psycopg's back (a `DEALLOCATE` of one name, a pooler's reset) fails
the caller's transaction with `InvalidSqlStatementName`, as the cursor's EXECUTE would; here
psycopg is also told to forget the name, so the cursor prepares the statement again afterwards.
Other errors are psycopg's own (`errors.error_from_result`), wrapped by SQLAlchemy as the
cursor's are (`IntegrityError` for a duplicate key); an interrupt is psycopg's `wait`'s (it
cancels the query on the server), as on the cursor.

`run` answers `NOT_RUN` unless: the checks of `pg_libpq` (psycopg 3.1 to 3.3 with the
internals these use, psycopg's default `Cursor`, `prepare_threshold` not None, not in autocommit
or psycopg's pipeline mode), the answer wanted is the row count, psycopg's prepare manager is
the one this was written for, and the connection is inside a transaction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from consumer_kit.core import pg_libpq

#: `run`'s answer when it sent nothing: run the statement on the cursor.
NOT_RUN = pg_libpq.NOT_RUN

_GONE = "26000"      # invalid_sql_statement_name: no prepared statement of that name


def run(raw: Any, sql: str, params: Mapping[str, Any], answer: str) -> Any:
    """Run `sql` (named `pyformat` parameters) with `params` inside the transaction `raw` (a
    psycopg connection) is in, under psycopg's prepared statement for it; return its row count,
    or `NOT_RUN` when psycopg holds no such statement or this path cannot take it."""
    names = _names(raw)
    if not names:  # psycopg prepared nothing on this connection (yet)
        return NOT_RUN
    api = pg_libpq.usable_api(raw, answer)
    if api is None:
        return NOT_RUN
    with raw.lock:
        if not pg_libpq.in_state(api, raw, api.pq.TransactionStatus.INTRANS):
            return NOT_RUN
        query = pg_libpq.converted(api, raw, sql, params)
        key = (query.query, query.types)
        name = names.get(key)
        if not isinstance(name, bytes):  # not prepared (yet), or a psycopg keeping other things
            return NOT_RUN
        names.move_to_end(key)  # used: the last psycopg evicts, as its cursor keeps it
        pg = raw.pgconn
        pg.send_query_prepared(name, query.params, param_formats=query.formats)
        result = raw.wait(api.generators.execute(pg))[-1]
        if pg_libpq.failed(api, result, _GONE):
            names.pop(key, None)  # dropped behind psycopg's back: its cursor prepares anew
        return pg_libpq.rowcount(api, pg_libpq.checked(api, [result], raw.info.encoding))

def _names(raw: Any) -> OrderedDict[tuple[bytes, tuple[int, ...]], bytes] | None:
    """psycopg's statement names by (query, types) on `raw`, or None when its prepare manager
    is not the one this was written for."""
    names = getattr(getattr(raw, "_prepared", None), "_names", None)
    return names if isinstance(names, OrderedDict) else None
