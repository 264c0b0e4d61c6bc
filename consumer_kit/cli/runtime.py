"""What every `ckit` command shares at run time: one-line errors, logging set-up, signals."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

try:  # typer >= 0.2x vendors its own click; older versions use click itself
    from typer import _click as click
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]

from consumer_kit.core.errors import CkitError
from consumer_kit.core.progress import committed_before
from consumer_kit.core.urls import mask_text

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

#: Exit codes: 2 a usage, configuration or database error before any work was committed
#: (nothing was done); 1 an unexpected failure, or any failure after a batch run committed
#: part of its work (`core.progress`: the line says how much).
EXIT_USAGE = 2
EXIT_FAILURE = 1
#: Ctrl-C (SIGINT) stopped a command that does not stop cleanly on it: 128 + SIGINT
EXIT_INTERRUPTED = 130
#: `ckit consume`: the consumer stalled and rebuilding it did not help (restart the process)
EXIT_STALLED = 3
#: name prefix of the threads that shut a native RocketMQ consumer down
NATIVE_STOP_THREAD = "ckit-rmq-stop-"


def require(value: str | None, option: str, env: str) -> str:
    """Return `value`, or fail with one line naming the option and its environment variable."""
    if not value:
        fail(f"missing {option} (or set {env})")
    return value


def existing_database(url: str | None) -> Engine:
    """The engine of `--url` (or `CKIT_DB_URL`) for a command that works on tables already
    made: a SQLite file that is not there is refused (connecting would make an empty one, a
    typo in its path left behind as a file)."""
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.sqlite_files import check_sqlite_path

    engine = make_engine(require(url, "--url", "CKIT_DB_URL"))
    if engine.dialect.name == "sqlite":
        check_sqlite_path(engine.url.database, engine.url.query, must_exist=True)
    return engine


def exit_if_native_shutdown_hangs(code: int) -> None:
    """End the process with `code` now (`os._exit`, after flushing) when a RocketMQ consumer's
    native shutdown has not returned: its C++ threads would otherwise keep the process from
    exiting, and a supervisor waiting for the exit would never restart it."""
    hung = [t.name for t in threading.enumerate()
            if t.name.startswith(NATIVE_STOP_THREAD) and t.is_alive()]
    if not hung:
        return
    log.error("native consumer shutdown did not return (%s): exiting without waiting for it",
              ", ".join(hung))
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: message` (passwords masked, one line) on stderr and exit with `code`."""
    first = " ".join(mask_text(str(message)).split())
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code)


def _one_line_usage_errors(main: Callable[..., Any], args: Sequence[str] | None,
                           prog_name: str | None, complete_var: str | None,
                           standalone_mode: bool, windows_expand_args: bool,
                           extra: dict[str, Any], prefix: str = "error") -> Any:
    """Run click's `main` so that its own usage errors (a value out of range, a missing or
    unknown option) are one `error:` line naming the option and exit 2, like `fail`: click
    would print the usage and a box of several lines. `ckit` alone still prints the help."""
    if not standalone_mode:
        return main(args, prog_name, complete_var, False, windows_expand_args, **extra)
    try:
        code = main(args, prog_name, complete_var, False, windows_expand_args, **extra)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.ClickException as exc:
        line = " ".join(mask_text(exc.format_message()).split())
        typer.echo(f"{prefix}: {line}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(EXIT_FAILURE)
    sys.exit(code if isinstance(code, int) else 0)


class OneLineGroup(TyperGroup):
    """The `ckit` group: usage errors as one line (`typer.Typer(cls=OneLineGroup)`)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        return _one_line_usage_errors(super().main, args, prog_name, complete_var,
                                      standalone_mode, windows_expand_args, extra)


#: options of one value whose repetition reads as "several" (`ckit relay`, `ckit receipts` and
#: `ckit reconcile` take several `--url`s), and what to do instead; other options keep click's
#: last-one-wins (a wrapper script's default overridden further along the line)
ONE_VALUE_OPTIONS = {
    "--url": "works on one database (ckit relay, receipts and reconcile take several); run it "
             "once per database",
    "--shard": "serves one shard i/N; run a relay per shard (or one without --shard for all)",
}


class OneValueCommand(TyperCommand):
    """A `ckit` command that refuses an option of `ONE_VALUE_OPTIONS` given more than once:
    click keeps the last silently, so `--url A --url B` on a command of one database did its
    work on B alone and exited 0 (`outbox archive` left A's rows in place), and a relay
    given `--shard 0/2 --shard 1/2` served 1/2 alone."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except click.ClickException:
            order = []  # (the parse below says what is wrong)
        counts: dict[str, int] = {}
        for param in order:
            if isinstance(param, TyperOption) and not param.multiple:
                for name in set(param.opts) & set(ONE_VALUE_OPTIONS):
                    counts[name] = counts.get(name, 0) + 1
        for name, count in counts.items():
            if count > 1:
                raise click.exceptions.UsageError(
                    f"{name} given {count} times: ckit "
                    f"{ctx.command_path.split(' ', 1)[-1]} {ONE_VALUE_OPTIONS[name]}", ctx)
        return super().parse_args(ctx, args)


def one_value_options(app: typer.Typer) -> None:
    """Make every command of `app` and of its sub-apps a `OneValueCommand`."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # (typer's default)
            info.cls = OneValueCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            one_value_options(group.typer_instance)


class OneLineCommand(OneValueCommand):
    """A single-command app (the spark-submit entry): usage errors as one line, with click's
    own `Error:` prefix, which scripts around spark-submit match."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        return _one_line_usage_errors(super().main, args, prog_name, complete_var,
                                      standalone_mode, windows_expand_args, extra, "Error")


def friendly_errors(fn: F) -> F:
    """Turn library and driver errors into one clear line and a non-zero exit (no traceback).

    Exit 2 says nothing was done. An error raised after a batch run committed part of its
    work (`core.progress`) exits 1 instead, and its line says what stays committed. Ctrl-C
    (a `KeyboardInterrupt`: commands that stop cleanly on SIGINT install `on_shutdown`) is
    `error: interrupted`, with what stays committed, and exit 130 (typer's own exit for it
    was silent)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, BrokenPipeError):
            raise
        except KeyboardInterrupt as exc:
            done = committed_before(exc)
            fail("interrupted" + (f" (after {done}: that stays committed; running the command "
                                  "again goes on from there)" if done else ""),
                 code=EXIT_INTERRUPTED)
        except Exception as exc:
            line, code = error_line(exc)
            done = committed_before(exc)
            if done:
                line, code = (f"{line} (after {done}: that stays committed; running the "
                              "command again goes on from there)", EXIT_FAILURE)
            fail(line, code=code)

    return wrapper  # type: ignore[return-value]


def error_line(exc: Exception) -> tuple[str, int]:
    """The one line `friendly_errors` prints for `exc` (before any progress), and its exit
    code: 2 for library, option, database and OS errors, 1 for anything unexpected."""
    if isinstance(exc, (CkitError, ValueError)):
        return str(exc), EXIT_USAGE
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(exc, SQLAlchemyError):  # driver errors: say what failed, never a traceback
        detail = getattr(exc, "orig", None) or exc
        return f"database error: {type(detail).__name__}: {str(detail).splitlines()[0]}", \
            EXIT_USAGE
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}", EXIT_USAGE
    log.debug("unexpected error", exc_info=True)
    return f"{type(exc).__name__}: {exc}", EXIT_FAILURE


def configure_logging(verbose: int) -> None:
    """Configure logging for the CLI only (library code never does this). Messages pass
    through `mask_text`, so a URL with a password never reaches the log."""
    level = logging.WARNING - 10 * min(verbose, 2)
    handler = _StderrHandler()
    handler.setFormatter(_MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_pool_reset_in_one_line)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in NEVER_DEBUG:
        logging.getLogger(name).setLevel(max(level, logging.INFO))


#: Loggers kept at INFO or above even with `-vv`: py4j logs every command it sends to Spark's
#: JVM at DEBUG, the JDBC connection properties (a password) among them, in its own wire
#: format, which `mask_text` cannot know (a key on one line, its value on the next).
NEVER_DEBUG = ("py4j",)


def _pool_reset_in_one_line(record: logging.LogRecord) -> bool:
    """SQLAlchemy's pool logs a full traceback at ERROR when a connection the database (or a
    network fault) killed fails its rollback on the way back to the pool. The pool discards it
    and the next checkout opens a new one; the work on it was rolled back, or is retried or
    reported by whoever used it. One warning line says so, naming the error."""
    if record.name.startswith("sqlalchemy.pool") and record.exc_info \
            and record.msg == "Exception during reset or similar":
        error = record.exc_info[1]
        record.msg = ("a database connection failed its reset on return to the pool "
                      "(%s): discarded, the next use opens a new one")
        record.args = (f"{type(error).__name__}: {error}".splitlines()[0],)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is emitted, not the stream it was at
    configuration: a caller that swaps stderr and closes its stand-in afterwards (a test
    runner invoking the CLI in-process) must not leave the log writing to a closed file."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))


def on_shutdown(stop: Callable[[], None]) -> None:
    """Call `stop` on SIGTERM or SIGINT (main thread only); a second signal exits at once.

    `stop` runs on a thread of its own: the handler runs on the main thread between two
    bytecodes, maybe while that thread holds a lock `stop` takes, and would wait for itself
    for ever while the consumer went on consuming. (The stop event's own lock was one:
    `run_consumer` and the relay now wait for it without taking it on the main thread,
    `core.stop_wait`; `stop` may be any callable.)"""
    hits = {"n": 0}
    _received.clear()

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise SystemExit(128 + signum)
        _received.append(signum)
        threading.Thread(target=stop, name="ckit-shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


#: the signal `on_shutdown`'s handler received (empty until one came)
_received: list[int] = []


def signalled_line(run: str, left: str) -> tuple[str, int] | None:
    """After a run that drains and exits (`relay --once`, `--burst`) that `on_shutdown`'s
    signal stopped: its line and exit code (128 + the signal), not the exit 0 that says it
    drained (`run` names the option, `left` what was left to drain and what becomes of it);
    None when no signal came.

    >>> signalled_line("--once", "what was due") is None  # no signal came
    True
    """
    if not _received:
        return None
    signum = _received[0]
    return (f"stopped by {signal.Signals(signum).name} before {run} drained {left}",
            128 + signum)


def fail_if_signalled(run: str, left: str) -> None:
    """`fail` with `signalled_line`'s line and code when a signal stopped the run."""
    said = signalled_line(run, left)
    if said is not None:
        fail(*said)


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


def writable_folder(path: str | Path, *, option: str) -> Path:
    """`path` as a folder this process can write in, created when missing.

    Raises:
        ConfigError: naming `option`, when it cannot be created or written (before any work).
    """
    from consumer_kit.core.errors import ConfigError

    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ckit-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {str(path)!r} is not a writable folder: "
                          f"{exc.strerror or exc}") from None
    return folder
