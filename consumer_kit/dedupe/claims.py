"""What a Redis claim answers."""

from __future__ import annotations

import enum


class Claim(enum.Enum):
    """What the claim script answered."""

    CLAIMED = 0
    DUPLICATE = 1
    BUSY = 2
    UNAVAILABLE = 3
