"""Combiner: concurrent calls share batches, each caller gets its own result or the batch's
error, and it never stalls."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from consumer_kit.combining import Combiner


def test_a_lone_call_is_sent_alone_and_gets_its_result() -> None:
    sent: list[list[int]] = []

    def send(items: Sequence[int]) -> list[int]:
        sent.append(list(items))
        return [i * 10 for i in items]

    combiner: Combiner[int, int] = Combiner(send)
    assert combiner.call(1) == 10
    assert combiner.call(2) == 20
    assert sent == [[1], [2]]


def test_calls_arriving_during_a_send_ride_in_the_next_batch_with_their_own_results() -> None:
    # Given: a send that takes a while (a network round trip)
    def send(items: Sequence[int]) -> list[int]:
        time.sleep(0.01)
        return [i * 10 for i in items]

    combiner: Combiner[int, int] = Combiner(send)
    results: dict[int, int] = {}
    start = threading.Barrier(16)

    def caller(base: int) -> None:
        start.wait()
        for i in range(base, base + 5):
            results[i] = combiner.call(i)

    # When: 16 threads call 5 times each
    threads = [threading.Thread(target=caller, args=(t * 100,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Then: everyone got the answer to its own item, in far fewer sends than calls
    assert results == {i: i * 10 for t in range(16) for i in range(t * 100, t * 100 + 5)}
    assert combiner.items == 80
    assert combiner.batches < 40


def test_a_failed_send_raises_in_every_caller_of_that_batch_and_the_next_batch_works() -> None:
    gate = threading.Event()
    calls = 0

    def send(items: Sequence[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(5)  # hold the first batch so the others queue behind it
            return ["first"]
        if calls == 2:
            raise ConnectionError("redis down")
        return ["ok"] * len(items)

    combiner: Combiner[str, str] = Combiner(send)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            combiner.call("x")
        except ConnectionError as exc:
            errors.append(exc)

    first = threading.Thread(target=combiner.call, args=("leader",))
    first.start()
    while not combiner._leading:
        time.sleep(0.001)
    waiting = [threading.Thread(target=caller) for _ in range(3)]
    for t in waiting:
        t.start()
    while len(combiner._queue) < 3:
        time.sleep(0.001)
    gate.set()
    first.join(5)
    for t in waiting:
        t.join(5)
    assert len(errors) == 3  # the three queued calls formed the second batch, which failed
    assert combiner.call("after") == "ok"


def test_batches_never_exceed_max_batch() -> None:
    sizes: list[int] = []

    def send(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        time.sleep(0.005)
        return list(items)

    combiner: Combiner[int, int] = Combiner(send, max_batch=3)
    threads = [threading.Thread(target=lambda: [combiner.call(i) for i in range(20)])
               for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(sizes) == 200
    assert max(sizes) <= 3


def test_a_send_returning_the_wrong_number_of_results_is_an_error() -> None:
    combiner: Combiner[int, int] = Combiner(lambda items: [])
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        combiner.call(1)


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Combiner(lambda items: items, max_batch=0)
