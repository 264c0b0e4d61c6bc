"""A lost connection that a driver raises as a plain socket error, turned into SQLAlchemy's.

pg8000 lets the operating system's error through when the server drops a connection while it
waits for an answer (a `ConnectionResetError` on the first read of a message: a terminated
backend, a restart; errors on writing it wraps as `InterfaceError("network error")`).
SQLAlchemy wraps only the driver's own DB-API errors, so such an error would reach the relay or
a consumer as a plain `OSError`, not as the outage it is: not waited out, and the dead
connection handed out again by the pool. `treat_socket_errors_as_disconnects` makes it
SQLAlchemy's `OperationalError` with the connection invalidated, as psycopg's would be.

Only an error raised inside the driver's own code counts: a tracing or logging listener's
`ConnectionRefusedError` or time-out stays its own error. Not covered: the first read of a new
connection's start-up answer (SQLAlchemy's connect path runs no `handle_error` hook for it; the
connect fails and is retried like a refused one), and a pre-ping (`make_engine` sets none on
PostgreSQL).
"""

from __future__ import annotations

from types import TracebackType

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine, ExceptionContext


def treat_socket_errors_as_disconnects(engine: Engine) -> None:
    """Have `engine` raise a socket error from its driver as SQLAlchemy's `OperationalError`,
    invalidating the connection (and the pool's others, as for any disconnect). Repeating it
    on one engine is harmless."""
    if not event.contains(engine, "handle_error", _socket_error_as_disconnect):
        event.listen(engine, "handle_error", _socket_error_as_disconnect)


def _socket_error_as_disconnect(context: ExceptionContext) -> exc.OperationalError | None:
    """The `handle_error` hook: a connection error or time-out raised in the driver's code
    becomes a disconnect; any other error passes as it is."""
    error = context.original_exception
    if context.sqlalchemy_exception is not None or not isinstance(
            error, (ConnectionError, TimeoutError)):
        return None
    if context.engine is None or not _raised_in(error.__traceback__, context.engine.dialect.driver):
        return None
    context.is_disconnect = True
    return exc.OperationalError(context.statement, context.parameters, error,
                                hide_parameters=context.engine.hide_parameters,
                                connection_invalidated=True)


def _raised_in(tb: TracebackType | None, package: str) -> bool:
    """Whether a frame of `tb` runs code of `package` (the driver's modules)."""
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == package or module.startswith(package + "."):
            return True
        tb = tb.tb_next
    return False
