"""What a Redis claim answers."""

from __future__ import annotations

import enum


class Claim(enum.Enum):
    """What the claim script answered."""

    CLAIMED = 0
    DUPLICATE = 1
    BUSY = 2
    UNAVAILABLE = 3


#: `Claim` by the script's integer answer (a dict read: `Claim(answer)` costs about ten times
#: more, on every message)
BY_ANSWER: dict[int, Claim] = {claim.value: claim for claim in Claim}


def key_error(exc: Exception) -> bool:
    """Whether a script's error is its key's own (WRONGTYPE: a key holding another type): that
    claim alone fails. Any other error Redis answers is about Redis itself, for every key: out
    of memory under `noeviction`, a read-only replica, an ACL refusing the script, a
    persistence failure (MISCONF): Redis is away for our writes, and the store degrades.
    Redis 7 answers a script's WRONGTYPE as such; Redis 6 and older wrap it in `ERR Error
    running script (...): @user_script:N: WRONGTYPE ...`, and an OOM there comes as `OOM` or
    wrapped the same way, never with WRONGTYPE in it."""
    return "WRONGTYPE" in str(exc)
