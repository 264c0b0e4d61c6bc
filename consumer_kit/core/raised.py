"""What was raised: an exception as text that never raises itself, and whether an exception
means the process is stopping.

A handler's exception becomes a reason (a processed row's `error`, a receipt, a log line). Its
`str()` is user code and can raise: the reason must still name the handler's exception, not the
error its `str()` raised.
"""

from __future__ import annotations

#: the exceptions that mean the process is stopping (an exit, Ctrl-C, a generator closed):
#: never taken as a handler's failure, always raised on
STOPPING: tuple[type[BaseException], ...] = (SystemExit, KeyboardInterrupt, GeneratorExit)


def stops_the_process(exc: BaseException) -> bool:
    """Whether `exc` means the process is stopping (`STOPPING`), not that a call failed."""
    return isinstance(exc, STOPPING)


def exception_text(exc: BaseException) -> str:
    """`str(exc)`; when that raises, `repr(exc)` saying so; when that raises too,
    `<unprintable NAME object>`. An exception that stops the process (`STOPPING`) raised by
    either is raised on."""
    try:
        return str(exc)
    except BaseException as failed:
        if stops_the_process(failed):
            raise
        why = type(failed).__name__
    try:
        return f"{exc!r} (its str() raised {why})"
    except BaseException as failed:
        if stops_the_process(failed):
            raise
    return f"<unprintable {type(exc).__name__} object>"


def describe_exception(exc: BaseException) -> str:
    """`exc` as a reason: `NAME: TEXT` (`exception_text`), never raising."""
    return f"{type(exc).__name__}: {exception_text(exc)}"
