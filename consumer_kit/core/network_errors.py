"""A lost connection that a driver raises as a plain socket error, turned into SQLAlchemy's.

pg8000 lets the operating system's error through when the server drops a connection while it
waits for an answer (a `ConnectionResetError` on the first read of a message: a terminated
backend, a restart; errors on writing it wraps as `InterfaceError("network error")`).
SQLAlchemy wraps only the driver's own DB-API errors, so such an error would reach the relay or
a consumer as a plain `OSError`, not as the outage it is: not waited out, and the dead
connection handed out again by the pool. `treat_socket_errors_as_disconnects` makes it
SQLAlchemy's `OperationalError` with the connection invalidated, as psycopg's would be.

The same error on connecting (the first read of the server's start-up answer: a load balancer
with no backend up that accepts and resets, a server going down) used to escape bare too:
SQLAlchemy's connect path wraps only DB-API errors and runs no `handle_error` hook there. The
dialect's own `connect` is wrapped to make it the driver's own `InterfaceError`, as pg8000
raises a refused connection, which SQLAlchemy wraps. Not a `do_connect` hook: the first such
hook that returns a connection ends the chain, so a caller's own hook added later (a fresh
password or token in `cparams`, as SQLAlchemy's documentation shows) would never run.

The pool's pre-ping (an engine made with `pool_pre_ping=True`: `make_engine` sets none on
PostgreSQL, a caller's engine may) met the same bare error when the server had reset the pooled
connection, and let it out of `engine.connect()`: SQLAlchemy's pre-ping takes only DB-API errors
for a disconnect, so a reset that psycopg's pre-ping turns into a new connection, unseen, reached
a consumer as its handler's failure. The dialect's `do_ping` is wrapped as its `connect` is.
And pg8000's `close()` of a dead connection raises (it sends its Terminate message on the dead
socket, then closes the socket all the same), which the pool logged at ERROR with a traceback
for every dropped connection it replaced, even on a pre-ping that replaced it unseen: the
dialect's `do_close` lets a disconnect on closing pass (at DEBUG), as psycopg's and PyMySQL's
close of a dead connection raise nothing.

Only an error raised inside the driver's own code counts: a tracing or logging listener's
`ConnectionRefusedError` or time-out stays its own error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import Dialect, Engine, ExceptionContext

log = logging.getLogger(__name__)


def treat_socket_errors_as_disconnects(engine: Engine) -> None:
    """Have `engine` raise a socket error from its driver as SQLAlchemy's `OperationalError`,
    invalidating the connection (and the pool's others, as for any disconnect); its pool's
    pre-ping take one for a disconnect (a new connection, unseen), and its pool close a dead
    connection without an error logged. Repeating it on one engine is harmless."""
    if not event.contains(engine, "handle_error", _socket_error_as_disconnect):
        event.listen(engine, "handle_error", _socket_error_as_disconnect)
    dialect = engine.dialect  # (engines share a dialect: each method is wrapped once)
    _wrap(dialect, "connect", lambda connect: _socket_errors_as_interface_errors(
        dialect, connect, "connect"))
    _wrap(dialect, "do_ping", lambda ping: _socket_errors_as_interface_errors(
        dialect, ping, "pre-ping"))
    _wrap(dialect, "do_close", lambda close: _dead_connection_closed_quietly(dialect, close))


#: the mark of a dialect method this module wrapped
_WRAPPED = "_ckit_socket_errors_wrapped"


def _wrap(dialect: Dialect, name: str,
          wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace `dialect.<name>` by `wrapper(dialect.<name>)`, unless this module did already."""
    method = getattr(dialect, name)
    if getattr(method, _WRAPPED, False):
        return
    wrapped = wrapper(method)
    setattr(wrapped, _WRAPPED, True)
    wrapped.__wrapped__ = method  # type: ignore[attr-defined]
    setattr(dialect, name, wrapped)


def _socket_errors_as_interface_errors(dialect: Dialect, method: Callable[..., Any],
                                       on: str) -> Callable[..., Any]:
    """`method` of `dialect` (`connect`, `do_ping`), a connection error or time-out raised in
    the driver's code becoming the driver's `InterfaceError("network error on <on>: ...")`,
    which SQLAlchemy wraps and pg8000's dialect takes for a disconnect (a pre-ping then
    replaces the connection)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (ConnectionError, TimeoutError) as error:
            if not _raised_in(error.__traceback__, dialect.driver):
                raise
            raise dialect.loaded_dbapi.InterfaceError(
                f"network error on {on}: {type(error).__name__}: {error}") from error

    return wrapped


def _dead_connection_closed_quietly(dialect: Dialect, close: Callable[..., Any]
                                    ) -> Callable[..., Any]:
    """`dialect.do_close`, an error the dialect takes for a disconnect passing as a close done
    (logged at DEBUG): the connection was dead already, and its socket is closed."""

    def wrapped(dbapi_connection: Any) -> None:
        try:
            close(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if not dialect.is_disconnect(error, dbapi_connection, None):
                raise
            log.debug("closed a dead %s connection (%s)", dialect.driver, error)

    return wrapped


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
