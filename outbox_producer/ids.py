"""Message ids: ULIDs (time-ordered, 26 Crockford base32 characters, 80 random bits)."""

from __future__ import annotations

import base64
import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: RFC 4648 base32 digits -> Crockford's, digit for digit (same 5-bit values)
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


def new_message_id() -> str:
    """Return a new ULID string, e.g. `01HXZ3K5V8Q9W2E4R6T7Y8U9I0`.

    The first 10 characters encode the millisecond timestamp, so ids sort by creation time
    (handy in logs and for index locality); the other 16 are random.
    """
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    # 26 digits are 130 bits; as 20 bytes (160 bits, 32 digits, no padding) the value's digits
    # are the last 26 (the first 6 encode leading zero bits)
    digits = base64.b32encode(value.to_bytes(20, "big")).translate(_CROCKFORD)
    return digits[6:].decode("ascii")
