"""What every `ckit` subcommand shares: options with CKIT_* fallbacks, errors, output."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import typer

from consumer_kit.errors import CkitError
from consumer_kit.urls import mask_text

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("consumer_kit.cli")

DB_URL_HELP = "SQLAlchemy URL of the database (env CKIT_DB_URL)"
TRANSPORT_HELP = (
    "transport URL: memory://NAME, sql+<db-url>, rocketmq://host:port (env CKIT_TRANSPORT)"
)


def db_url_option(help_text: str = DB_URL_HELP) -> Any:
    """The `--url` option, falling back to CKIT_DB_URL."""
    return typer.Option(None, "--url", envvar="CKIT_DB_URL", help=help_text, show_default=False)


def transport_option() -> Any:
    """The `--transport` option, falling back to CKIT_TRANSPORT."""
    return typer.Option(None, "--transport", envvar="CKIT_TRANSPORT", help=TRANSPORT_HELP,
                        show_default=False)


def json_option() -> Any:
    """The `--json` flag: machine-readable output on stdout."""
    return typer.Option(False, "--json", help="print JSON instead of a table")


def require(value: str | None, option: str, env: str) -> str:
    """Return `value`, or fail with one line naming the option and its environment variable."""
    if not value:
        fail(f"missing {option} (or set {env})")
    assert value is not None
    return value


def fail(message: str, code: int = 2) -> None:
    """Print `error: message` (passwords masked) on stderr and exit with `code`."""
    typer.echo(f"error: {mask_text(message)}", err=True)
    raise typer.Exit(code)


def friendly_errors(fn: F) -> F:
    """Turn library and driver errors into one clear line and a non-zero exit (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except CkitError as exc:
            fail(str(exc))
        except ValueError as exc:
            fail(str(exc))
        except Exception as exc:  # driver errors: say what failed, never dump a traceback
            from sqlalchemy.exc import SQLAlchemyError

            if isinstance(exc, SQLAlchemyError):
                detail = getattr(exc, "orig", None) or exc
                fail(f"database error: {type(detail).__name__}: {str(detail).splitlines()[0]}")
            log.debug("unexpected error", exc_info=True)
            fail(f"{type(exc).__name__}: {exc}", code=1)

    return wrapper  # type: ignore[return-value]


def configure_logging(verbose: int) -> None:
    """Configure logging for the CLI only (library code never does this)."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print rows as an aligned plain-text table."""
    text_rows = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(v)) for w, v in zip(widths, row)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    typer.echo(line)
    typer.echo("  ".join("-" * w for w in widths))
    for row in text_rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def print_totals(totals: dict[str, Any], as_json: bool) -> None:
    """Print a one-row summary of counters, as a table or (with `--json`) as JSON."""
    if as_json:
        print_json(totals)
    else:
        print_table(list(totals), [list(totals.values())])


def print_json(data: Any) -> None:
    """Print `data` as JSON (datetimes and other objects as strings)."""
    typer.echo(json.dumps(data, default=str, indent=2, sort_keys=True))
