"""One statement per message sent to PostgreSQL below psycopg's cursor, as a prepared statement.

`Outbox.publish` (the outbox row) and the consumer's dedupe (the processed row, the first
statement of the handler's transaction) each run one INSERT per message in the caller's
transaction (`consumer_kit.core.driver_sql`). On psycopg the cursor costs two things here that
the statement does not need:

- its Python: adapting the parameters, the prepared-statement bookkeeping, the results (about
  0.03 ms a statement, right after a round trip when little of it is in the CPU's caches);
- a round trip of its own for `BEGIN` when the statement opens the transaction (psycopg sends
  it, then the statement): the processed row always does.

`run` sends the statement through psycopg's libpq connection (`pgconn`) as a named prepared
statement, with the parameters in text form, and when the transaction has not begun yet, sends
psycopg's own `BEGIN` (its isolation level, read-only and deferrable settings) with it in one
round trip (libpq's pipeline mode). The first use on a connection prepares the statement in
that same round trip.

The prepared statement lives on the server session. It is registered in psycopg's own cache of
prepared statements, so whatever makes psycopg forget its statements forgets this one too: a
rollback of a transaction (psycopg then sends `DEALLOCATE ALL`), `DISCARD ALL`, `DEALLOCATE
ALL`, `DROP` or `ALTER` run through psycopg, its least-recently-used limit (`prepared_max`: it
deallocates the evicted name). `run` finds it missing from the cache and prepares it again
under a new name.

`run` answers `NOT_RUN` (nothing sent, the caller uses the cursor) unless all of these hold:
psycopg 3.1 to 3.3 with the internals this uses (checked once per process) and libpq's pipeline
mode; the connection not in psycopg's pipeline mode, not in autocommit, inside a transaction or
before its first statement (not one that failed), its client encoding UTF-8, psycopg's
`prepare_threshold` not None (the switch psycopg users turn off prepared statements with, for a
pooler that cannot keep them); every value a `str` without NUL, an `int` (not a `bool`),
`bytes`, None or a datetime without time zone (what publish's and the processed row's columns
take); the answer wanted the row count or a scalar. Errors are psycopg's own
(`errors.error_from_result`), so SQLAlchemy wraps them as it wraps the cursor's
(`IntegrityError` for a duplicate key); a failure half-way through the exchange closes the
connection (SQLAlchemy then invalidates it) rather than leave it in a state psycopg does not
know.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

#: `run`'s answer when it sent nothing: run the statement on the cursor.
NOT_RUN: Any = object()

_PARAM = re.compile(r"%\((\w+)\)s")
_INT_OIDS = frozenset((20, 21, 23))  # int8, int2, int4
_names = itertools.count(1)
#: the second half of every key this module puts in psycopg's cache (psycopg's own keys are
#: (query, parameter type oids))
_MARK = ("consumer-kit",)
#: the parameters as sent and their formats (`_values`)
_Sent = tuple[list[bytes | None], list[int] | None]


class Statement:
    """A driver statement with named `pyformat` parameters made into PostgreSQL's `$n` form,
    and the parameter names in `$n` order."""

    __slots__ = ("columns", "key", "sql")

    def __init__(self, sql: bytes, columns: Sequence[str]) -> None:
        self.sql = sql
        self.columns = tuple(columns)
        self.key = (sql, _MARK)


_statements: dict[str, Statement | None] = {}


def statement(sql: str) -> Statement | None:
    """`sql` (named `pyformat` parameters, as `compile_for_driver` makes it) in `$n` form, or
    None when it holds a `%` that is not a parameter."""
    try:
        return _statements[sql]
    except KeyError:
        pass
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    converted = _PARAM.sub(number, sql)
    found = None if "%" in converted else Statement(converted.encode(), order)
    _statements[sql] = found
    return found


def run(raw: Any, sql: str, params: Mapping[str, Any], answer: str) -> Any:
    """Run `sql` with `params` on the psycopg connection `raw` (the module docstring) and return
    `answer` of it ("rowcount" or "scalar"), or `NOT_RUN` when this path cannot take it."""
    api = _psycopg()
    if api is None or answer not in ("rowcount", "scalar"):
        return NOT_RUN
    stmt = statement(sql)
    if stmt is None:
        return NOT_RUN
    sent = _values(stmt.columns, params)
    if sent is None:
        return NOT_RUN
    prepared = getattr(raw, "_prepared", None)
    names = getattr(prepared, "_names", None)
    if not isinstance(names, OrderedDict) or raw.prepare_threshold is None:
        return NOT_RUN
    with raw.lock:
        pg = raw.pgconn
        if raw._pipeline is not None or pg.status != api.pq.ConnStatus.OK \
                or pg.parameter_status(b"client_encoding") != b"UTF8":
            return NOT_RUN
        status = pg.transaction_status
        if status == api.pq.TransactionStatus.INTRANS:
            begin = None
        elif status == api.pq.TransactionStatus.IDLE and not raw.autocommit:
            begin = raw._get_tx_start_command()
        else:
            return NOT_RUN
        known = names.get(stmt.key)
        fresh = known is None
        if known is None:
            name = f"_ckit_{next(_names)}".encode()
        else:
            name = known
            names.move_to_end(stmt.key)  # used: the last psycopg would evict
        results = _exchange(api, raw, pg, begin, name if fresh else None, stmt, name, sent)
        if fresh and results[0 if begin is None else 1].status == api.pq.ExecStatus.COMMAND_OK:
            names[stmt.key] = name  # prepared, even when the statement failed after it
    result = _checked(api, results)
    if answer == "rowcount":
        return result.command_tuples
    if result.ntuples == 0:
        return None
    value = result.get_value(0, 0)
    if value is None:
        return None
    return int(value) if result.ftype(0) in _INT_OIDS else value.decode()


def _exchange(api: Any, raw: Any, pg: Any, begin: bytes | None, prepare: bytes | None,
              stmt: Statement, name: bytes, sent: _Sent) -> list[Any]:
    """Send `begin`, the PREPARE (when `prepare`) and the statement in one round trip; return
    the result of each, in that order."""
    if begin is None and prepare is None:
        pg.send_query_prepared(name, sent[0], sent[1])
        return list(raw.wait(api.generators.execute(pg)))
    return _pipelined(api, raw, pg, begin, prepare, stmt, name, sent)


def _checked(api: Any, results: list[Any]) -> Any:
    """The last result (the statement's), or the first error among `results` raised."""
    ok = api.pq.ExecStatus
    for result in results:
        if result.status == ok.FATAL_ERROR:
            raise api.errors.error_from_result(result, encoding="utf-8")
        if result.status not in (ok.COMMAND_OK, ok.TUPLES_OK):
            raise api.errors.InternalError(f"unexpected result from PostgreSQL: "
                                           f"{ok(result.status).name}")
    return results[-1]


def _pipelined(api: Any, raw: Any, pg: Any, begin: bytes | None, prepare: bytes | None,
               stmt: Statement, name: bytes, sent: _Sent) -> list[Any]:
    """The commands in libpq's pipeline mode, one result each, in order (a command after a
    failed one answers PIPELINE_ABORTED)."""
    commands = 1 + (begin is not None) + (prepare is not None)
    pg.enter_pipeline_mode()
    try:
        if begin is not None:
            pg.send_query_params(begin, None)
        if prepare is not None:
            pg.send_prepare(prepare, stmt.sql)
        pg.send_query_prepared(name, sent[0], sent[1])
        pg.pipeline_sync()
        raw.wait(api.generators.send(pg))
        results = [raw.wait(api.generators.fetch_many(pg))[-1] for _ in range(commands)]
        sync = raw.wait(api.generators.fetch_many(pg))
        if len(sync) != 1 or sync[0].status != api.pq.ExecStatus.PIPELINE_SYNC:
            raise api.errors.InternalError("PostgreSQL's pipeline did not end as expected")
        pg.exit_pipeline_mode()
    except BaseException:
        # the connection is somewhere psycopg does not know: never use it again
        raw.close()
        raise
    return results


def _values(columns: Sequence[str], params: Mapping[str, Any]
            ) -> tuple[list[bytes | None], list[int] | None] | None:
    """The parameters in `$n` order, each in text form but `bytes` (bytea's binary form: the
    bytes themselves), and their formats (None: all text); or None when one is of a type this
    path does not send (the cursor's adapters then take them all)."""
    values: list[bytes | None] = []
    binary: list[int] = []
    try:
        for column in columns:
            value = params[column]
            kind = type(value)
            if value is None:
                values.append(None)
            elif kind is str:
                if "\x00" in value:  # libpq would cut it there: psycopg refuses it
                    return None
                values.append(value.encode())
            elif kind is int:
                values.append(str(value).encode())
            elif kind is bytes:
                binary.append(len(values))
                values.append(value)
            elif kind is dt.datetime and value.tzinfo is None:
                values.append(value.isoformat().encode())
            else:
                return None
    except (KeyError, UnicodeEncodeError):
        return None
    if not binary:
        return values, None
    formats = [0] * len(values)
    for at in binary:
        formats[at] = 1
    return values, formats


class _API:
    """The psycopg modules `run` uses."""

    def __init__(self, generators: Any, pq: Any, errors: Any) -> None:
        self.generators = generators
        self.pq = pq
        self.errors = errors


_api: list[_API | None] = []


def _psycopg() -> _API | None:
    """psycopg's modules, once per process, or None when this psycopg is not one `run` was
    written for (3.1 to 3.3: the cache, the transaction start command, pipeline mode)."""
    if _api:
        return _api[0]
    found: _API | None = None
    try:
        import psycopg
        from psycopg import errors, generators, pq

        version = tuple(int(part) for part in psycopg.__version__.split(".")[:2])
        if (3, 1) <= version < (3, 4) and psycopg.Pipeline.is_supported() \
                and hasattr(psycopg.Connection, "_get_tx_start_command") \
                and hasattr(psycopg.Connection, "wait") \
                and hasattr(errors, "error_from_result") \
                and all(hasattr(generators, f) for f in ("execute", "send", "fetch_many")):
            found = _API(generators, pq, errors)
    except (ImportError, ValueError):
        found = None
    _api.append(found)
    return found
