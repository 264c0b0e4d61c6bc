"""A pooled connection given back without the pool's reset when its transaction ended cleanly.

SQLAlchemy's pool resets every connection it takes back by the driver's `rollback()`
(`pool_reset_on_return="rollback"`, the default). PyMySQL sends a ROLLBACK to the server for
it even when no transaction is open; psycopg sends nothing on an idle connection. So on MariaDB
and MySQL a transaction that has just committed pays one more round trip at check-in, for
nothing: after a COMMIT or ROLLBACK that its `Connection` made, with nothing run since, there
is no transaction to end and no lock to free.

`connection(engine)` checks out a `Connection` for one unit of work; when the block ends
without an exception and the `Connection` holds no transaction (it committed or rolled back
its own, and began none since), the connection goes back to the pool the way
`Connection.close` gives back one whose transaction it has just rolled back itself: with the
pool's reset skipped (`PoolResetState.transaction_was_reset`; the pool's `reset` event
listeners still run). Anything else (an exception, a transaction left open, an invalidated
connection, a SQLAlchemy without these internals) closes it as `Connection.close` does,
reset and all.

The consumer's transaction per message (its processed row and the handler's writes) uses it:
one round trip fewer per message on MariaDB, and per duplicate a ROLLBACK fewer. So do the
relay's transactions (`begin`): its claim, its marks, its releases.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy.engine import Connection, Engine


@contextlib.contextmanager
def connection(engine: Engine) -> Iterator[Connection]:
    """`engine.connect()` for one unit of work, given back by `give_back` when the block ends
    without an exception, by `Connection.close` (reset included) when it raises."""
    conn = engine.connect()
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    give_back(conn)


@contextlib.contextmanager
def begin(engine: Engine) -> Iterator[Connection]:
    """`engine.begin()` whose connection goes back by `give_back`: the block's transaction is
    committed when it ends without an exception (rolled back when it raises), then the
    connection is given back without the pool's reset."""
    with connection(engine) as conn, conn.begin():
        yield conn


def give_back(conn: Connection) -> None:
    """Close `conn`; skip the pool's reset when `conn` ended its transaction itself and holds
    none (the module docstring). Otherwise exactly `conn.close()`."""
    fairy = getattr(conn, "_dbapi_connection", None)
    close_special = getattr(fairy, "_close_special", None)
    if (fairy is None or close_special is None or conn.in_transaction()
            or conn.invalidated or getattr(conn, "_transaction", None) is not None):
        conn.close()
        return
    try:
        close_special(transaction_reset=True)  # as Connection.close after its own rollback
    except TypeError:  # another SQLAlchemy's signature: nothing was given back, close as usual
        conn.close()
        return
    conn._dbapi_connection = None  # given back: not twice
    conn.close()  # marks the Connection closed; no pool work left for it
