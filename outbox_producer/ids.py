"""Message ids: ULIDs (time-ordered, 26 Crockford base32 characters, 80 random bits)."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_message_id() -> str:
    """Return a new ULID string, e.g. `01HXZ3K5V8Q9W2E4R6T7Y8U9I0`.

    The first 10 characters encode the millisecond timestamp, so ids sort by creation time
    (handy in logs and for index locality); the other 16 are random.
    """
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))
