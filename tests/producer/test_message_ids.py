"""Message ids are ULIDs: 26 Crockford base32 digits whose first 10 are the millisecond."""

from __future__ import annotations

import time

from outbox_producer.ids import _ALPHABET, new_message_id


def decode(ulid: str) -> int:
    value = 0
    for char in ulid:
        value = value * 32 + _ALPHABET.index(char)
    return value


def test_an_id_is_26_crockford_digits_carrying_the_millisecond_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    ulid = new_message_id()
    after = time.time_ns() // 1_000_000
    assert len(ulid) == 26 and set(ulid) <= set(_ALPHABET)
    assert before <= decode(ulid) >> 80 <= after


def test_ids_made_later_sort_later_and_never_repeat() -> None:
    first = new_message_id()
    time.sleep(0.002)
    later = [new_message_id() for _ in range(10_000)]
    assert all(first < ulid for ulid in later)
    assert len(set(later)) == len(later)
