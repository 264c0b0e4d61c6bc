"""The statement that opens a transaction, sent to PostgreSQL with psycopg's BEGIN in one round
trip, as a prepared statement.

The consumer's dedupe inserts the processed row as the first statement of the handler's
transaction (`consumer_kit.processed`), through `consumer_kit.core.driver_sql`. On psycopg the
cursor sends `BEGIN` in a round trip of its own before it, and costs Python of its own
(adapting the parameters, its prepared-statement bookkeeping, the results). `run` sends
psycopg's own `BEGIN` (its isolation level, read-only and deferrable settings) and the statement
in one libpq pipeline through psycopg's libpq connection (`pgconn`), as a named prepared
statement (its PREPARE in the same round trip on first use). The parameters are adapted by
psycopg's own `Transformer` and query conversion, as the cursor adapts them: the same text,
types and formats, custom dumpers included.

A named statement lives on the server session, so something may drop it behind this module's
back (psycopg's `DEALLOCATE ALL` after a rollback, `DISCARD ALL`, a pooler). Nothing of the
caller's is in the transaction yet when `run` sends, so that is mended where it shows: an
EXECUTE that finds its statement gone (SQLSTATE 26000), or a PREPARE that finds it there already
(42P05: the name is the digest of the statement's text and types, so it is the same statement),
rolls back the transaction it just began and sends BEGIN and the statement again, prepared or
not as the server said, in one more round trip.

`run` answers `NOT_RUN` (nothing sent; the caller uses the cursor) unless: psycopg 3.1 to 3.3
with the internals this uses (checked once per process) and libpq's pipeline mode; the answer
wanted is the row count; the connection is idle (the statement opens the transaction), not in
autocommit or psycopg's pipeline mode; its cursors are psycopg's default `Cursor` (a
`ClientCursor` factory asks for client-side binding: no prepared statements) and its
`prepare_threshold` is not None (the switch psycopg users turn prepared statements off with, for
a pooler that cannot keep them). A statement inside a transaction already begun has nothing to
share a round trip with: `consumer_kit.core.pg_prepared` runs it under psycopg's own prepared
statement, or the cursor does. Errors are psycopg's own
(`errors.error_from_result`), so SQLAlchemy wraps them as it wraps the cursor's
(`IntegrityError` for a duplicate key); a failure half-way through an exchange ends the
connection (SQLAlchemy then invalidates it) rather than leave it in a state psycopg does not
know.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Mapping
from typing import Any

#: `run`'s answer when it sent nothing: run the statement on the cursor.
NOT_RUN: Any = object()

_GONE = "26000"      # invalid_sql_statement_name: no prepared statement of that name
_THERE = "42P05"     # duplicate_prepared_statement: one of that name exists already

#: the names this module prepared, per psycopg connection (the server may have dropped some)
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


def run(raw: Any, sql: str, params: Mapping[str, Any], answer: str) -> Any:
    """Run `sql` (named `pyformat` parameters) with `params` on the psycopg connection `raw` as
    its transaction's first statement, with its BEGIN (the module docstring); return its row
    count, or `NOT_RUN` when this path cannot take it."""
    api = usable_api(raw, answer)
    if api is None:
        return NOT_RUN
    with raw.lock:
        pg = raw.pgconn
        if not in_state(api, raw, api.pq.TransactionStatus.IDLE):
            return NOT_RUN
        query = converted(api, raw, sql, params)
        name = _name(query.query, query.types)
        known = _prepared.setdefault(raw, set())
        begin = raw._get_tx_start_command()
        prepare = name not in known
        results = _exchange(api, raw, pg, [begin], query, name, prepare=prepare)
        mend = _mend(api, results, prepare=prepare)
        if mend is not None:  # gone, or there already: ours was the only statement in it
            prepare = mend
            results = _exchange(api, raw, pg, [b"ROLLBACK", begin], query, name,
                                prepare=prepare)
        # the PREPARE's result, when one was sent, is the one before the EXECUTE's
        if failed(api, results[-1], _GONE):
            known.discard(name)
        elif not prepare or results[-2].status == api.pq.ExecStatus.COMMAND_OK:
            known.add(name)  # there: it answered, or the PREPARE went in
    return rowcount(api, checked(api, results, raw.info.encoding))


def usable_api(raw: Any, answer: str) -> _API | None:
    """psycopg's names when a statement on the psycopg connection `raw`, answering `answer`,
    may go below its cursor (the module docstring's conditions that do not change under a
    transaction), else None."""
    api = _psycopg()
    if api is None or answer != "rowcount" or raw.prepare_threshold is None \
            or raw.cursor_factory is not api.Cursor:
        return None
    return api


def in_state(api: _API, raw: Any, transaction_status: Any) -> bool:
    """True when `raw` (its lock held) is a healthy connection in `transaction_status`, not in
    autocommit or psycopg's pipeline mode."""
    pg = raw.pgconn
    return bool(raw._pipeline is None and not raw.autocommit
                and pg.status == api.pq.ConnStatus.OK
                and pg.transaction_status == transaction_status)


def converted(api: _API, raw: Any, sql: str, params: Mapping[str, Any]) -> Any:
    """`sql` and `params` as psycopg's cursor would send them on `raw` (its `PostgresQuery`)."""
    query = api.PostgresQuery(api.Transformer.from_context(raw))
    query.convert(sql, params)
    return query


def rowcount(api: _API, result: Any) -> int:
    """What psycopg's cursor's `rowcount` reads from `result`: the rows returned, when any
    (RETURNING, a SELECT); else the command's count, -1 for a command without one (CALL)."""
    if result.status == api.pq.ExecStatus.TUPLES_OK:
        return int(result.ntuples)
    count = result.command_tuples
    return -1 if count is None else int(count)


_names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}


def _name(query: bytes, types: tuple[int, ...]) -> bytes:
    """The prepared statement's name: a digest of its text and parameter types, the same in
    every process (one found on the server under it is this statement)."""
    try:
        return _names[query, types]
    except KeyError:
        name = b"_ckit_" + hashlib.sha1(query + repr(types).encode()).hexdigest()[:20].encode()
        if len(_names) < 1000:  # a handful of statements; never unbounded
            _names[query, types] = name
        return name


def _mend(api: Any, results: list[Any], *, prepare: bool) -> bool | None:
    """None when `results` need no second try; else whether the second must prepare (the
    statement was gone) or not (it was there already)."""
    if prepare and failed(api, results[1], _THERE):
        return False
    if not prepare and failed(api, results[-1], _GONE):
        return True
    return None


def failed(api: Any, result: Any, sqlstate: str) -> bool:
    """True when `result` is an error of SQLSTATE `sqlstate`."""
    return bool(result.status == api.pq.ExecStatus.FATAL_ERROR
                and result.error_field(api.pq.DiagnosticField.SQLSTATE) == sqlstate.encode())


def _exchange(api: Any, raw: Any, pg: Any, leading: list[bytes], query: Any, name: bytes,
              *, prepare: bool) -> list[Any]:
    """In one round trip (libpq's pipeline mode): the `leading` commands, the PREPARE of `query`
    as `name` (when `prepare`) and its EXECUTE. One result per command, in order (a command
    after a failed one answers PIPELINE_ABORTED)."""
    pg.enter_pipeline_mode()
    try:
        for command in leading:
            pg.send_query_params(command, None)
        if prepare:
            pg.send_prepare(name, query.query, param_types=query.types)
        pg.send_query_prepared(name, query.params, param_formats=query.formats)
        pg.pipeline_sync()
        raw.wait(api.generators.send(pg))
        results = [raw.wait(api.generators.fetch_many(pg))[-1]
                   for _ in range(len(leading) + prepare + 1)]
        sync = raw.wait(api.generators.fetch_many(pg))
        if len(sync) != 1 or sync[0].status != api.pq.ExecStatus.PIPELINE_SYNC:
            raise api.errors.InternalError("PostgreSQL's pipeline did not end as expected")
        pg.exit_pipeline_mode()
    except BaseException:
        # the connection is somewhere psycopg does not know: end it (never used again)
        pg.finish()
        raise
    return results


def checked(api: Any, results: list[Any], encoding: str) -> Any:
    """The last result (the statement's), or the first error among `results` raised (its text
    decoded as the connection's)."""
    ok = api.pq.ExecStatus
    for result in results:
        if result.status == ok.FATAL_ERROR:
            raise api.errors.error_from_result(result, encoding=encoding)
        if result.status not in (ok.COMMAND_OK, ok.TUPLES_OK):
            raise api.errors.InternalError(f"unexpected result from PostgreSQL: "
                                           f"{ok(result.status).name}")
    return results[-1]


class _API:
    """The psycopg names `run` uses."""

    def __init__(self, psycopg: Any, queries: Any) -> None:
        self.generators = psycopg.generators
        self.pq = psycopg.pq
        self.errors = psycopg.errors
        self.Cursor = psycopg.Cursor
        self.Transformer = psycopg.adapt.Transformer
        self.PostgresQuery = queries.PostgresQuery


_api: list[_API | None] = []


def _psycopg() -> _API | None:
    """psycopg's modules, once per process, or None when this psycopg is not one `run` was
    written for (3.1 to 3.3: the transaction start command, the query conversion, pipeline
    mode; `generators.execute` for `consumer_kit.core.pg_prepared`)."""
    if _api:
        return _api[0]
    found: _API | None = None
    try:
        import psycopg
        import psycopg.adapt
        import psycopg.errors
        import psycopg.generators
        from psycopg import _queries

        version = tuple(int(part) for part in psycopg.__version__.split(".")[:2])
        if (3, 1) <= version < (3, 4) and psycopg.Pipeline.is_supported() \
                and hasattr(psycopg.Connection, "_get_tx_start_command") \
                and hasattr(psycopg.Connection, "wait") \
                and hasattr(psycopg.errors, "error_from_result") \
                and hasattr(_queries, "PostgresQuery") \
                and all(hasattr(psycopg.generators, f)
                        for f in ("send", "fetch_many", "execute")):
            found = _API(psycopg, _queries)
    except (ImportError, ValueError):
        found = None
    _api.append(found)
    return found
