"""Calling user code (a handler, a `dedupe_key` function) so that whatever it raises, short of
the process stopping, takes the path of a failure.

A `BaseException` that is not an `Exception` (a library's own, a gevent timeout, an
`asyncio.CancelledError` from a loop the handler ran) would otherwise pass every
`except Exception` of the framework and leave the message without its outcome: on its last
attempt, dead-lettered by the broker without a DEAD_LETTERED processed row. `call` carries it
as `Raised`, an `Exception`; the exceptions that mean the process is stopping
(`core.raised.STOPPING`: `SystemExit`, `KeyboardInterrupt`, `GeneratorExit`) are raised as
they are (docs/signals.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from consumer_kit.core.raised import describe_exception, stops_the_process

R = TypeVar("R")


class Raised(Exception):
    """A `BaseException`, not an `Exception` and not one that stops the process, raised by user
    code: `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(describe_exception(error))
        #: what the user code raised
        self.error = error


def call(fn: Callable[..., R], *args: object) -> R:
    """`fn(*args)`; a `BaseException` it raises that is neither an `Exception` nor one that
    stops the process is raised as `Raised` (chained to it)."""
    try:
        return fn(*args)
    except BaseException as exc:
        if isinstance(exc, Exception) or stops_the_process(exc):
            raise
        raise Raised(exc) from exc


def unwrapped(exc: BaseException) -> BaseException:
    """What user code raised: `exc`, or the error a `Raised` carries."""
    return exc.error if isinstance(exc, Raised) else exc
