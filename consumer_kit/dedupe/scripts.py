"""The Lua scripts of the Redis fast path, run by EVALSHA and loaded again when Redis lost them
(a restart, a failover, SCRIPT FLUSH).

One pipelined round trip runs many calls (`run_pipelined`). redis-py's own `Script` objects
would ask SCRIPT EXISTS before every pipeline; these ask only after a NOSCRIPT answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis

Call = tuple["LuaScript", Sequence[str], Sequence[object]]


class LuaScript:
    """One script of this package (`claim.lua`, `finish.lua`, `renew.lua`, `release.lua`)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.source = resources.files("consumer_kit.dedupe").joinpath(name).read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, keys: Sequence[str], args: Sequence[object]) -> Any:
        """Run the script alone; errors are raised."""
        answer = run_pipelined(self.client, [(self, keys, args)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def load(self) -> None:
        """Load the script into Redis (after NOSCRIPT)."""
        self.client.script_load(self.source)


def run_pipelined(client: redis.Redis, calls: Sequence[Call]) -> list[Any]:
    """Run `calls` in one pipelined round trip. A call's own error (NOSCRIPT aside) comes back
    as its answer; calls that met NOSCRIPT run again once their script is loaded (a script call
    that repeats is safe: ours are idempotent for the same token). A connection error raises.
    """
    answers = _pipeline(client, calls)
    lost = [i for i, a in enumerate(answers) if isinstance(a, redis.exceptions.NoScriptError)]
    if lost:
        for script in {calls[i][0] for i in lost}:
            script.load()
        for i, answer in zip(lost, _pipeline(client, [calls[i] for i in lost])):
            answers[i] = answer
    return answers


def _pipeline(client: redis.Redis, calls: Sequence[Call]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for script, keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    return list(pipe.execute(raise_on_error=False))
