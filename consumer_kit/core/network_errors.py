"""A lost connection that a driver raises as a plain socket error, turned into SQLAlchemy's.

pg8000 lets the operating system's error through when the server drops a connection while it
waits for an answer (a `ConnectionResetError` on the first read of a message: a terminated
backend, a restart; errors on writing it wraps as `InterfaceError("network error")`).
SQLAlchemy wraps only the driver's own DB-API errors, so such an error would reach the relay or
a consumer as a plain `OSError`, not as the outage it is: not waited out, and the dead
connection handed out again by the pool. `treat_socket_errors_as_disconnects` makes it
SQLAlchemy's `OperationalError` with the connection invalidated, as psycopg's would be.
"""

from __future__ import annotations

from sqlalchemy import event, exc
from sqlalchemy.engine import Engine, ExceptionContext


def treat_socket_errors_as_disconnects(engine: Engine) -> None:
    """Have `engine` raise a socket error from its driver as SQLAlchemy's `OperationalError`,
    invalidating the connection (and the pool's others, as for any disconnect)."""
    if not event.contains(engine, "handle_error", _socket_error_as_disconnect):
        event.listen(engine, "handle_error", _socket_error_as_disconnect)


def _socket_error_as_disconnect(context: ExceptionContext) -> exc.OperationalError | None:
    """The `handle_error` hook: a bare connection error or time-out becomes a disconnect; any
    other error (a `PermissionError` from a logging hook, say) passes as it is."""
    error = context.original_exception
    if context.sqlalchemy_exception is not None or not isinstance(
            error, (ConnectionError, TimeoutError)):
        return None
    context.is_disconnect = True
    hide = context.engine.hide_parameters if context.engine is not None else False
    return exc.OperationalError(context.statement, context.parameters, error,
                                hide_parameters=hide, connection_invalidated=True)
