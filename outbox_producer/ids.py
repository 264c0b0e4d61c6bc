"""Message ids: ULIDs (time-ordered, 26 Crockford base32 characters, 80 random bits)."""

from __future__ import annotations

import base64
import datetime as dt
import os
import time

from consumer_kit.core.clock import to_epoch_ms

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: RFC 4648 base32 digits -> Crockford's, digit for digit (same 5-bit values)
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


def new_message_id() -> str:
    """Return a new ULID string, e.g. `01HXZ3K5V8Q9W2E4R6T7Y8U9I0`.

    The first 10 characters encode the millisecond timestamp, so ids sort by creation time
    (handy in logs and for index locality); the other 16 are random.
    """
    # 2 zero bits + 48 bits of milliseconds are the first 10 digits, the 80 random bits the
    # other 16 (10 bytes are exactly 16 base32 digits): the time part is encoded once per
    # millisecond, the random part by one b32encode of 10 bytes
    ms = time.time_ns() // 1_000_000
    prefix = _prefix_of.get(ms)
    if prefix is None:
        prefix = _time_digits(ms)
        _prefix_of.clear()
        _prefix_of[ms] = prefix
    return prefix + base64.b32encode(os.urandom(10)).translate(_CROCKFORD).decode("ascii")


#: the last millisecond's 10 time digits (one entry; a dict read is thread-safe)
_prefix_of: dict[int, str] = {}


def _time_digits(ms: int) -> str:
    """The 10 Crockford digits of a 48-bit millisecond timestamp (50 bits, zero-padded)."""
    return "".join(_ALPHABET[(ms >> shift) & 31] for shift in range(45, -1, -5))


def ulid_floor(moment: dt.datetime) -> str:
    """The smallest ULID of `moment`'s millisecond (naive UTC, or aware): its ten time
    characters and sixteen zeros. Message ids made at or after `moment` sort at or after it."""
    return _time_digits(to_epoch_ms(moment)) + "0" * 16
