"""The Lua scripts of the Redis fast path, run by EVALSHA and loaded again when Redis lost them
(a restart, a failover, SCRIPT FLUSH).

One pipelined round trip runs many calls (`run_pipelined`). redis-py's own `Script` objects
would ask SCRIPT EXISTS before every pipeline; these ask only after a NOSCRIPT answer.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, cast

import redis

#: (script, KEYS, ARGV). ARGV is text, numbers formatted by the caller: see `evalsha`.
Call = tuple["LuaScript", Sequence[str], Sequence[str]]


class LuaScript:
    """One script of this package (`claim.lua`, `finish.lua`, `renew.lua`, `release.lua`)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.source = resources.files("consumer_kit.dedupe").joinpath(name).read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run the script alone; errors are raised."""
        answer = run_pipelined(self.client, [(self, keys, args)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def load(self) -> None:
        """Load the script into Redis (after NOSCRIPT)."""
        self.client.script_load(self.source)


def run_pipelined(client: redis.Redis, calls: Sequence[Call], *, alone: bool = True
                  ) -> list[Any]:
    """Run `calls` in one pipelined round trip. A call's own error (NOSCRIPT aside) comes back
    as its answer; calls that met NOSCRIPT run again once their script is loaded (a script call
    that repeats is safe: ours are idempotent for the same token). A connection error raises.
    A lone call goes on the calling thread's own connection (see `_alone`) unless `alone` is
    false: the background writer keeps the pipeline, which costs it more per call, so that
    done markers queue up and go in batches instead of waking it (and taking a core from the
    consume threads) once per message.
    """
    answers = _pipeline(client, calls, alone)
    lost = [i for i, a in enumerate(answers) if isinstance(a, redis.exceptions.NoScriptError)]
    if lost:
        for script in {calls[i][0] for i in lost}:
            script.load()
        for i, answer in zip(lost, _pipeline(client, [calls[i] for i in lost], alone)):
            answers[i] = answer
    return answers


def _pipeline(client: redis.Redis, calls: Sequence[Call], alone: bool) -> list[Any]:
    if alone and len(calls) == 1:  # the common case: one consumer thread's claim
        answer = _alone(client, calls[0])
        if answer is not _FAILED:
            return [answer]
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.execute_command(*evalsha(call))
    return list(pipe.execute(raise_on_error=False))


def evalsha(call: Call) -> tuple[str, ...]:
    """The EVALSHA command of `call`, its numbers as text.

    hiredis's packer (which redis-py calls when hiredis is installed) formats a number by a
    call that can run a Python signal handler, and does not check that call's result: a
    handler raising there (Ctrl-C on the main thread) crashes the process with a segmentation
    fault instead of raising (hiredis 3.5.0). So `numkeys` is formatted here and a `Call`'s
    ARGV is text already (its type says so; the callers format their milliseconds once), and
    a handler's exception is raised like anywhere else. The bytes on the wire are the same."""
    script, keys, args = call
    count = len(keys)
    return ("EVALSHA", script.sha, _NUMKEYS[count] if count < len(_NUMKEYS) else str(count),
            *keys, *args)


_NUMKEYS = tuple(str(n) for n in range(8))


#: hiredis's RESP packer, called straight exactly when redis-py's own packer calls it (after
#: per-argument checks that our str and int arguments never need): then both encode a str as
#: UTF-8 and the lone claim writes the same key bytes as the pipeline and the pending claims.
#: Without a hiredis redis-py accepts, redis-py packs (with the client's encoding).
_pack: Callable[[tuple[Any, ...]], bytes] | None = None
if redis.utils.HIREDIS_AVAILABLE:
    import hiredis

    _pack = cast(Callable[[tuple[Any, ...]], bytes], hiredis.pack_command)

#: redis-py's hiredis packer: a connection with it (or a subclass) packs by hiredis (no class
#: to match when this redis-py has none)
_HIREDIS_PACKER: type | tuple[type, ...] = getattr(redis.connection, "HiredisRespSerializer", ())


def pack_calls(conn: Any, calls: Sequence[Call]) -> list[bytes]:
    """The EVALSHA commands of `calls` packed for `conn.send_packed_command`.

    When the connection packs with hiredis (redis-py's `HiredisRespSerializer`, which
    `packer.TextNumbersPacker` extends), hiredis is called straight and the commands joined
    into one buffer (one send); any other packer packs them itself. The bytes are those of
    `conn.pack_commands`: a pending claim sends them right after a database round trip, when
    little of redis-py's per-argument loop is in the CPU's caches.

    Raises:
        redis.DataError: an argument hiredis cannot pack (as redis-py's packer raises it).
    """
    if _pack is not None and isinstance(getattr(conn, "_command_packer", None), _HIREDIS_PACKER):
        try:
            return [b"".join([_pack(evalsha(call)) for call in calls])]
        except TypeError as exc:
            raise redis.DataError(str(exc)) from exc
    return cast(list[bytes], conn.pack_commands([evalsha(call) for call in calls]))


#: `_alone`'s answer when the connection failed: the pipeline (with the client's retries) runs it
_FAILED = object()


def _alone(client: redis.Redis, call: Call) -> Any:
    """One EVALSHA straight on this thread's own connection: a pipeline of one costs redis-py
    about twice the round trip, and taking a connection from the pool and giving it back about
    half of one more (timed ad hoc on this project's machine); the
    duplicate rejection is one such call. A script's error is the answer; a connection error
    gives `_FAILED` after dropping the connection (it reconnects on its next use), and the
    caller runs the call again through the pipeline, which retries as the client is
    configured (a repeated call is safe)."""
    conn = thread_connection(client.connection_pool)
    begin_call(conn)
    try:
        # hiredis straight when the connection packs with it: redis-py's packer adds about
        # 4 us a call
        conn.send_packed_command(pack_calls(conn, [call]))
        try:
            answer = conn.read_response()
        except redis.exceptions.ResponseError as exc:
            answer = exc
        conn.ckit_unread = False
        return answer
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        conn.disconnect()
        return _FAILED
    except BaseException:
        # Interrupted between the send and the read (a signal handler raising on the main
        # thread): the answer left on the wire would be read as the thread's next call's.
        conn.disconnect()
        raise


def begin_call(conn: Any) -> None:
    """Before a call on a kept connection: drop the connection if the call before never read
    its answer (a signal handler raised in between, even inside the clean-up that should have
    dropped it: that answer, or half a command, may still be on the wire), then mark it
    (`ckit_unread`) until the caller has read this call's answer and clears the mark."""
    _drop_if_unread(conn)
    conn.ckit_unread = True


def _drop_if_unread(conn: Any) -> None:
    """Disconnect a connection still marked by `begin_call` (an answer of it was never read)."""
    if getattr(conn, "ckit_unread", False):
        conn.disconnect()


#: Connections kept per (thread id, pool, use). Keyed by the thread's id, not kept in a
#: `threading.local`: the RocketMQ 4.x client calls back on C++ threads, and CPython gives such
#: a thread a fresh thread state (so a fresh `threading.local`) for every callback; a local
#: would take a new connection per message and never give it back.
_kept: dict[tuple[int, int, str], tuple[Any, Any]] = {}
_kept_lock = threading.Lock()
# A forked child starts with none (redis-py's pool makes its own connections there).
os.register_at_fork(after_in_child=_kept.clear)


def thread_connection(pool: Any, use: str = "alone") -> Any:
    """A connection of `pool` kept by the calling thread for one `use` (taken once; the pool
    still counts it in use, so `pool.disconnect()` closes it, and it reconnects by itself).
    A Python thread gives it back when its thread object is collected; a thread made outside
    Python (the C++ client's callback threads, a bounded set) keeps it until
    `release_kept(pool)`. Each use has its own, so a claim whose answer is not read yet never
    shares its connection with another call. A forked child takes its own."""
    key = (threading.get_ident(), id(pool), use)
    entry = _kept.get(key)
    if entry is not None and entry[0] is pool:
        return entry[1]
    conn = pool.get_connection()
    with _kept_lock:
        _kept[key] = (pool, conn)
    thread = threading.current_thread()
    if not isinstance(thread, threading._DummyThread):
        weakref.finalize(thread, _give_back, key, conn)
    return conn


def release_kept(pool: Any) -> int:
    """Give back every connection kept for `pool` (its owner is closing); returns how many."""
    with _kept_lock:
        keys = [key for key, entry in _kept.items() if entry[0] is pool]
        entries = [_kept.pop(key) for key in keys]
    for held, conn in entries:
        _release(held, conn)
    return len(entries)


def kept_count(pool: Any) -> int:
    """How many connections threads keep for `pool` (for tests and diagnostics)."""
    with _kept_lock:
        return sum(1 for entry in _kept.values() if entry[0] is pool)


def _give_back(key: tuple[int, int, str], conn: Any) -> None:
    with _kept_lock:
        entry = _kept.get(key)
        if entry is None or entry[1] is not conn:
            return
        del _kept[key]
    _release(entry[0], conn)


def _release(pool: Any, conn: Any) -> None:
    """Give a kept connection back to its pool, dropped first if a call on it never read its
    answer (`begin_call`): a RESP3 pool does not check a connection for unread data."""
    _drop_if_unread(conn)
    pool.release(conn)
