"""A redis-py command packer that formats numbers in Python before hiredis packs a command.

hiredis 3.5.0's `pack_command` formats an int or float argument with `PyObject_Repr`, which
for an int checks for signals and runs a Python signal handler; when the handler raises (Ctrl-C
on the main thread), hiredis uses the NULL result: a segmentation fault instead of the
exception. redis-py hands it numbers of its own on every connect (`SELECT <db>`, `HELLO 3`),
so a second Ctrl-C during a reconnect could crash a process. Our own script calls send their
numbers as text already (`scripts.evalsha`); this packer covers everything else a client sends.
`client_options` also drops a connection whose handshake was interrupted.
"""

from __future__ import annotations

from typing import Any

from redis.connection import HiredisRespSerializer  # type: ignore[attr-defined]  # not in types-redis
from redis.utils import HIREDIS_AVAILABLE

_TEXT = frozenset((str, bytes))


class TextNumbersPacker(HiredisRespSerializer):
    """hiredis's packer, with int and float arguments turned to text first (by `repr`, as
    hiredis formats them: the bytes on the wire are the same). A bool is left to hiredis,
    which refuses it as redis-py's packer always did."""

    def pack(self, *args: Any) -> list[bytes]:
        """Pack one command (redis-py's `HiredisRespSerializer.pack`)."""
        if _TEXT.issuperset(map(type, args)):  # text already (our scripts' calls)
            return super().pack(*args)
        return super().pack(*[repr(a) if type(a) is int or isinstance(a, float) else a
                              for a in args])


def connect_or_drop(conn: Any) -> None:
    """redis-py's connect handshake (`AUTH`, `HELLO`, `SELECT <db>`, ...) that drops the
    connection when anything interrupts it. redis-py drops it on a Redis error only: a signal
    handler raising half-way (after the socket opened, before `SELECT`) left a connection that
    the pool hands out again as if ready, on database 0. (For `Redis` and `ConnectionPool`;
    `RedisCluster` runs its own handshake before this hook.)"""
    try:
        # redis-py's own lazy reconnect passes check_health=False (no PING inside the
        # handshake, no recursion through it); on_connect() would check
        handshake = getattr(conn, "on_connect_check_health", None)
        if handshake is not None:
            handshake(check_health=False)
        else:  # redis-py before 6
            conn.on_connect()
    except BaseException:
        conn.disconnect()
        raise


def client_options() -> dict[str, Any]:
    """Keyword arguments for `redis.Redis.from_url` (or `ConnectionPool`): the handshake of
    `connect_or_drop`, and `TextNumbersPacker` when redis-py packs with hiredis (its Python
    packer formats numbers in Python already).

    >>> client = redis.Redis.from_url(url, **client_options())  # doctest: +SKIP
    """
    options: dict[str, Any] = {"redis_connect_func": connect_or_drop}
    if HIREDIS_AVAILABLE:
        options["command_packer"] = TextNumbersPacker()
    return options
