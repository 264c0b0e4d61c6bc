"""What every `ckit` command shares at run time: one-line errors, logging set-up, signals."""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn, TypeVar

import typer

from consumer_kit.core.errors import CkitError
from consumer_kit.core.urls import mask_text

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

#: Exit codes: 2 a usage or configuration error (nothing was done), 1 an unexpected failure.
EXIT_USAGE = 2
EXIT_FAILURE = 1


def require(value: str | None, option: str, env: str) -> str:
    """Return `value`, or fail with one line naming the option and its environment variable."""
    if not value:
        fail(f"missing {option} (or set {env})")
    return value


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: message` (passwords masked, one line) on stderr and exit with `code`."""
    first = " ".join(mask_text(str(message)).split())
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code)


def friendly_errors(fn: F) -> F:
    """Turn library and driver errors into one clear line and a non-zero exit (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt, BrokenPipeError):
            raise
        except (CkitError, ValueError) as exc:
            fail(str(exc))
        except Exception as exc:  # driver errors: say what failed, never dump a traceback
            from sqlalchemy.exc import SQLAlchemyError

            if isinstance(exc, SQLAlchemyError):
                detail = getattr(exc, "orig", None) or exc
                fail(f"database error: {type(detail).__name__}: {str(detail).splitlines()[0]}")
            if isinstance(exc, OSError):
                fail(f"{type(exc).__name__}: {exc}")
            log.debug("unexpected error", exc_info=True)
            fail(f"{type(exc).__name__}: {exc}", code=EXIT_FAILURE)

    return wrapper  # type: ignore[return-value]


def configure_logging(verbose: int) -> None:
    """Configure logging for the CLI only (library code never does this). Messages pass
    through `mask_text`, so a URL with a password never reaches the log."""
    level = logging.WARNING - 10 * min(verbose, 2)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))


def on_shutdown(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM or SIGINT (main thread only); a second signal exits at once."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise SystemExit(128 + signum)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def serve_metrics(port: int | None) -> None:
    """Serve Prometheus metrics on 127.0.0.1:`port` when a port is given.

    Raises:
        ConfigError: the port is taken (one line, before any work).
    """
    if not port:
        return
    from prometheus_client import start_http_server

    from consumer_kit.core.errors import ConfigError

    try:
        start_http_server(port, addr="127.0.0.1")
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: {exc.strerror or exc}") from None
