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
