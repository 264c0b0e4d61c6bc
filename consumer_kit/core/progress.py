"""What a batch run had committed when it failed, carried on the error it raised.

A purge, an archive, a rotation or a reconcile commits batch by batch. When one of them fails
after its first batch, the batches before stay committed; the caller must not be told that
nothing was done. The loop wraps its batches in `committed_on_error`, and the error that
escapes it carries a note and `committed_before(error)` says what was done (the CLI exits 1
with that text, not 2, its "nothing was done" code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

#: the attribute of an exception holding what was committed before it
_ATTR = "ckit_committed_before"


def committed_before(exc: BaseException) -> str | None:
    """What the run that raised `exc` had committed before it (e.g. "2,000 rows archived in 2
    batches"), or None when nothing was."""
    done = getattr(exc, _ATTR, None)
    return done if isinstance(done, str) else None


_NOTE = "committed before the error: "


def mark_committed(exc: BaseException, done: str) -> None:
    """Record on `exc` that `done` was committed before it was raised, and say so in its
    notes (`__notes__`, which a traceback prints from Python 3.11; kept by hand, as
    `add_note` would, so that Python 3.10 keeps the error too). A run wrapping another marks
    after it and replaces its record: the outer run counts the whole run."""
    setattr(exc, _ATTR, done)
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        exc.__notes__ = notes
    notes[:] = [n for n in notes if not (isinstance(n, str) and n.startswith(_NOTE))]
    notes.append(_NOTE + done)


@contextlib.contextmanager
def committed_on_error(done: Callable[[], str | None]) -> Iterator[None]:
    """Mark an `Exception` or a `KeyboardInterrupt` (Ctrl-C) escaping the block with `done()`,
    unless it returns None or "" (the block committed nothing yet). `done` is called only on
    error, so it reads the run's counters as they are then."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as exc:
        text = done()
        if text:
            mark_committed(exc, text)
        raise


def counted(count: int, noun: str, verb: str, batches: int | None = None) -> str | None:
    """`count noun(s) verb[ in N batch(es)]`, or None when `count` is 0, for `committed_on_error`
    (e.g. `counted(2000, "row", "archived", 2)` is "2,000 rows archived in 2 batches")."""
    if not count:
        return None
    text = f"{count:,} {noun}{'' if count == 1 else 's'} {verb}"
    if batches:
        text += f" in {batches:,} batch{'' if batches == 1 else 'es'}"
    return text
