"""Message ids: ULIDs (time-ordered, 26 Crockford base32 characters, 80 random bits)."""

from __future__ import annotations

import datetime as dt
import os
import time

from consumer_kit.core.clock import to_epoch_ms

#: the length of every message id `new_message_id` makes
MESSAGE_ID_CHARS = 26

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: the two Crockford digits of every 10-bit value, in order
_PAIRS = tuple(high + low for high in _ALPHABET for low in _ALPHABET)


def new_message_id() -> str:
    """Return a new ULID string, e.g. `01HXZ3K5V8Q9W2E4R6T7Y8V9J0`.

    The first 10 characters encode the millisecond timestamp, so ids sort by creation time
    (handy in logs and for index locality); the other 16 are random.
    """
    return _ulid(time.time_ns() // 1_000_000, os.urandom(10))


def _ulid(ms: int, raw: bytes) -> str:
    """The 26 Crockford digits of a 48-bit millisecond timestamp (2 zero bits + 48) followed by
    the 80 bits of `raw`, most significant bit first: 13 look-ups of two digits each.

    publish pays this once per message right after a database round trip, when little of it
    is in the CPU's caches: fewer Python steps than a generator and `base64.b32encode`
    (`python bench/publish_floor.py` prints what making it costs there).
    """
    v = (ms << 80) | int.from_bytes(raw, "big")
    p = _PAIRS
    return "".join((p[v >> 120], p[(v >> 110) & 1023], p[(v >> 100) & 1023],
                    p[(v >> 90) & 1023], p[(v >> 80) & 1023], p[(v >> 70) & 1023],
                    p[(v >> 60) & 1023], p[(v >> 50) & 1023], p[(v >> 40) & 1023],
                    p[(v >> 30) & 1023], p[(v >> 20) & 1023], p[(v >> 10) & 1023],
                    p[v & 1023]))


def ulid_floor(moment: dt.datetime) -> str:
    """The smallest ULID of `moment`'s millisecond (naive UTC, or aware): its ten time
    characters and sixteen zeros. Message ids made at or after `moment` sort at or after it; a
    moment before 1970 (e.g. `now - 100 years`) gives the smallest ULID of all, not one that
    wraps around to sort after every id."""
    return _ulid(max(0, to_epoch_ms(moment)), bytes(10))
