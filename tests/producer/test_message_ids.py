"""Message ids are ULIDs: 26 Crockford base32 digits whose first 10 are the millisecond."""

from __future__ import annotations

import base64
import datetime as dt
import os
import time

from consumer_kit.core.clock import to_epoch_ms, utcnow
from outbox_producer.ids import _ALPHABET, _ulid, new_message_id, ulid_floor


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


def test_the_floor_of_a_moment_is_its_exact_millisecond_and_sorts_before_its_ids() -> None:
    base = dt.datetime(2026, 11, 25, 10, 0, 0)
    for micros in (0, 1, 999, 1000, 290_999, 578_999, 999_999):
        moment = base + dt.timedelta(microseconds=micros)
        floor = ulid_floor(moment)
        assert floor.endswith("0" * 16)
        assert decode(floor) >> 80 == to_epoch_ms(moment) == (
            (moment - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1))
    now = dt.datetime.now(dt.timezone.utc)
    assert ulid_floor(now.replace(tzinfo=None)) == ulid_floor(now)  # naive UTC or aware
    assert ulid_floor(now) <= new_message_id()


def test_an_id_is_the_milliseconds_then_the_bytes_in_crockfords_base32() -> None:
    crockford = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())

    def expected(ms: int, raw: bytes) -> str:
        time_digits = "".join(_ALPHABET[(ms >> shift) & 31] for shift in range(45, -1, -5))
        return time_digits + base64.b32encode(raw).translate(crockford).decode()

    edges = [bytes(10), b"\xff" * 10, bytes(range(10)), b"\x80" + bytes(9), bytes(9) + b"\x01"]
    now = time.time_ns() // 1_000_000
    for ms in (0, 1, 1023, 1024, now, 2**48 - 1):
        for raw in edges:
            assert _ulid(ms, raw) == expected(ms, raw)
    for _ in range(5_000):
        ms, raw = int.from_bytes(os.urandom(6), "big"), os.urandom(10)
        assert _ulid(ms, raw) == expected(ms, raw)
    assert _ulid(2**48 - 1, b"\xff" * 10) == "7" + "Z" * 25 and _ulid(0, bytes(10)) == "0" * 26


def test_utcnow_is_the_naive_utc_time_to_the_microsecond() -> None:
    for _ in range(1_000):
        before = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        now = utcnow()
        after = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        assert now.tzinfo is None and before <= now <= after


def test_the_floor_of_a_moment_before_1970_sorts_before_every_id() -> None:
    # `ckit outbox partitions rotate --older-than 100y` asks for now - 100 years: its horizon
    # must keep every partition, not sort after all of them
    for moment in (dt.datetime(1969, 12, 31, 23, 59, 59, 999_000), dt.datetime(1900, 1, 1),
                   dt.datetime.min, dt.datetime.now() - dt.timedelta(days=36525)):
        assert ulid_floor(moment) == "0" * 26 < new_message_id()
    assert ulid_floor(dt.datetime(1970, 1, 1)) == "0" * 26
    assert ulid_floor(dt.datetime(1970, 1, 1, 0, 0, 0, 1000)) == "0" * 9 + "1" + "0" * 16
