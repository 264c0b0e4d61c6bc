"""Message ids: ULIDs (time-ordered, 26 Crockford base32 characters, 80 random bits)."""

from __future__ import annotations

import datetime as dt
import os
import time

from consumer_kit.core.clock import to_epoch_ms

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: the two Crockford digits of every 10-bit value, in order: 80 random bits are 8 look-ups
_PAIRS = tuple(high + low for high in _ALPHABET for low in _ALPHABET)


def new_message_id() -> str:
    """Return a new ULID string, e.g. `01HXZ3K5V8Q9W2E4R6T7Y8U9I0`.

    The first 10 characters encode the millisecond timestamp, so ids sort by creation time
    (handy in logs and for index locality); the other 16 are random.
    """
    # 2 zero bits + 48 bits of milliseconds are the first 10 digits, the 80 random bits the
    # other 16: the time part is encoded once per millisecond, the random part by
    # `_random_digits` (half the time of `base64.b32encode` and a translate: publish pays it)
    ms = time.time_ns() // 1_000_000
    prefix = _prefix_of.get(ms)
    if prefix is None:
        prefix = _time_digits(ms)
        _prefix_of.clear()
        _prefix_of[ms] = prefix
    return prefix + _random_digits(os.urandom(10))


#: the last millisecond's 10 time digits (one entry; a dict read is thread-safe)
_prefix_of: dict[int, str] = {}


def _random_digits(raw: bytes) -> str:
    """The 16 Crockford digits of 10 bytes, most significant bit first: the same text as
    RFC 4648 base32 of those bytes with its alphabet swapped for Crockford's."""
    r = int.from_bytes(raw, "big")
    p = _PAIRS
    return "".join((p[r >> 70], p[(r >> 60) & 1023], p[(r >> 50) & 1023], p[(r >> 40) & 1023],
                    p[(r >> 30) & 1023], p[(r >> 20) & 1023], p[(r >> 10) & 1023], p[r & 1023]))


def _time_digits(ms: int) -> str:
    """The 10 Crockford digits of a 48-bit millisecond timestamp (50 bits, zero-padded)."""
    return "".join(_ALPHABET[(ms >> shift) & 31] for shift in range(45, -1, -5))


def ulid_floor(moment: dt.datetime) -> str:
    """The smallest ULID of `moment`'s millisecond (naive UTC, or aware): its ten time
    characters and sixteen zeros. Message ids made at or after `moment` sort at or after it."""
    return _time_digits(to_epoch_ms(moment)) + "0" * 16
