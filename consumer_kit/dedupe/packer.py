"""A redis-py command packer that formats numbers in Python before hiredis packs a command.

hiredis 3.5.0's `pack_command` formats an int or float argument with `PyObject_Repr`, which
for an int checks for signals and runs a Python signal handler; when the handler raises (Ctrl-C
on the main thread), hiredis uses the NULL result: a segmentation fault instead of the
exception. redis-py hands it numbers of its own on every connect (`SELECT <db>`, `HELLO 3`),
so a second Ctrl-C during a reconnect could crash a process. Our own script calls send their
numbers as text already (`scripts.evalsha`); this packer covers everything else a client sends.
"""

from __future__ import annotations

from typing import Any

from redis.connection import HiredisRespSerializer  # type: ignore[attr-defined]  # not in types-redis
from redis.utils import HIREDIS_AVAILABLE

_NUMBERS = frozenset((int, float))


class TextNumbersPacker(HiredisRespSerializer):
    """hiredis's packer, with exact int and float arguments turned to text first (by `repr`,
    as hiredis formats them: the bytes on the wire are the same)."""

    def pack(self, *args: Any) -> list[bytes]:
        """Pack one command (redis-py's `HiredisRespSerializer.pack`)."""
        if _NUMBERS.isdisjoint(map(type, args)):  # text already (our scripts' calls)
            return super().pack(*args)
        return super().pack(*[repr(a) if type(a) in _NUMBERS else a for a in args])


def client_options() -> dict[str, Any]:
    """Keyword arguments for `redis.Redis.from_url` (or `ConnectionPool`) that give every
    connection `TextNumbersPacker` when redis-py packs with hiredis; none otherwise (redis-py's
    Python packer formats numbers in Python already).

    >>> client = redis.Redis.from_url(url, **client_options())  # doctest: +SKIP
    """
    return {"command_packer": TextNumbersPacker()} if HIREDIS_AVAILABLE else {}
