"""Combiner: concurrent calls share batches, each caller gets its own result or an error for
its batch, `send` never runs twice at once, and an interrupted or forked caller stalls nobody."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from consumer_kit.core.errors import CkitError
from consumer_kit.dedupe import tokens
from consumer_kit.dedupe.combining import CombinedSendError, Combiner

DEADLINE = 10.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def run_threads(targets: list[Callable[[], None]]) -> None:
    """Start daemon threads (a deadlock must not hang pytest's exit) and join them, bounded."""
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), "a caller never returned"


class SlowSend:
    """A `send` that takes a while (a network round trip), records its batches and fails the
    test if it ever runs twice at once."""

    def __init__(self, delay: float = 0.005) -> None:
        self.delay = delay
        self.batches: list[list[int]] = []
        self.running = 0
        self.overlapped = False
        self._lock = threading.Lock()

    def __call__(self, items: Sequence[int]) -> list[int]:
        with self._lock:
            self.running += 1
            self.overlapped |= self.running > 1
        time.sleep(self.delay)
        with self._lock:
            self.running -= 1
            self.batches.append(list(items))
        return [i * 10 for i in items]


def test_a_lone_call_is_sent_alone_and_gets_its_result() -> None:
    send = SlowSend(0)
    combiner: Combiner[int, int] = Combiner(send)
    assert combiner.call(1) == 10
    assert combiner.call(2) == 20
    assert send.batches == [[1], [2]]


def test_concurrent_callers_share_batches_get_their_own_results_and_send_never_overlaps(
) -> None:
    # Given a send that takes a while and 16 threads calling 5 times each
    send = SlowSend()
    combiner: Combiner[int, int] = Combiner(send)
    results: dict[int, int] = {}
    start = threading.Barrier(16)

    def caller(base: int) -> Callable[[], None]:
        def run() -> None:
            start.wait()
            for i in range(base, base + 5):
                results[i] = combiner.call(i)
        return run

    # When
    run_threads([caller(t * 100) for t in range(16)])

    # Then everyone got the answer to its own item, in far fewer sends than calls, one at a time
    assert results == {i: i * 10 for t in range(16) for i in range(t * 100, t * 100 + 5)}
    assert combiner.items == 80
    assert combiner.batches < 40
    assert not send.overlapped


@pytest.mark.parametrize("max_batch", [1, 2, 3])
def test_batches_never_exceed_max_batch_and_every_caller_gets_its_own_result(
        max_batch: int) -> None:
    send = SlowSend()
    combiner: Combiner[int, int] = Combiner(send, max_batch=max_batch)
    wrong: list[tuple[int, int]] = []

    def caller(base: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(base, base + 10):
                got = combiner.call(i)
                if got != i * 10:
                    wrong.append((i, got))
        return run

    run_threads([caller(t * 100) for t in range(8)])
    assert wrong == []
    assert sum(len(b) for b in send.batches) == 80
    assert max(len(b) for b in send.batches) <= max_batch
    assert not send.overlapped


def held_leader(fail_second: BaseException | None = None, *,
                fail_first: BaseException | None = None,
                raised: list[BaseException] | None = None,
                ) -> tuple[Combiner[str, str], threading.Event, threading.Thread]:
    """A combiner whose leader thread is inside its first send, held until the returned gate
    is set; that send then raises `fail_first` (when given; the leader's error goes to
    `raised`), the second raises `fail_second` (when given), later sends answer "ok"."""
    gate = threading.Event()
    calls = 0

    def send(items: Sequence[str]) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(DEADLINE)
            if fail_first is not None:
                raise fail_first
            return ["first"] * len(items)
        if calls == 2 and fail_second is not None:
            raise fail_second
        return ["ok"] * len(items)

    def lead() -> None:
        try:
            combiner.call("leader")
        except BaseException as exc:
            if raised is None:
                raise
            raised.append(exc)

    combiner: Combiner[str, str] = Combiner(send)
    leader = threading.Thread(target=lead, daemon=True)
    leader.start()
    wait_for(lambda: combiner._leading, "the leader")
    return combiner, gate, leader


class Interrupt(BaseException):
    """Not an Exception, like KeyboardInterrupt or SystemExit."""


@pytest.mark.parametrize("failure", [ConnectionError("redis down"), Interrupt("stop")])
def test_a_failed_send_raises_the_original_in_its_leader_and_a_chained_error_in_the_others(
        failure: BaseException) -> None:
    # Given a first batch held in send, and three callers queued behind it
    combiner, gate, first = held_leader(failure)
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            combiner.call("x")
        except BaseException as exc:
            raised.append(exc)

    waiting = [threading.Thread(target=caller, daemon=True) for _ in range(3)]
    for t in waiting:
        t.start()
    wait_for(lambda: len(combiner._queue) == 3, "three queued callers")

    # When the first batch returns, the second batch (the three queued) fails
    gate.set()
    first.join(DEADLINE)
    for t in waiting:
        t.join(DEADLINE)

    # Then its leader got the original, the two riders a CombinedSendError caused by it
    assert len(raised) == 3
    originals = [e for e in raised if e is failure]
    chained = [e for e in raised if isinstance(e, CombinedSendError)]
    assert len(originals) == 1 and len(chained) == 2
    assert all(e.__cause__ is failure for e in chained)
    # And the combiner still works
    assert combiner.call("after") == "ok"


def test_a_lone_sender_whose_send_fails_still_hands_the_lead_to_the_callers_queued_meanwhile(
) -> None:
    # Given a lone caller inside a send that will fail, and two callers queued behind it
    raised: list[BaseException] = []
    combiner, gate, first = held_leader(fail_first=Interrupt("stop"), raised=raised)
    got: list[str] = []
    riders = [threading.Thread(target=lambda: got.append(combiner.call("x")), daemon=True)
              for _ in range(2)]
    for t in riders:
        t.start()
    wait_for(lambda: len(combiner._queue) == 2, "two queued callers")

    # When its send fails
    gate.set()
    for t in [first, *riders]:
        t.join(DEADLINE)

    # Then it got the original error, and the queued callers were sent and answered after it
    assert [type(e) for e in raised] == [Interrupt]
    assert got == ["ok", "ok"]
    assert not combiner._leading and combiner._queue == []


def test_a_send_returning_the_wrong_number_of_results_is_an_error() -> None:
    combiner: Combiner[int, int] = Combiner(lambda items: [])
    with pytest.raises(CkitError, match="0 results for 1 item"):
        combiner.call(1)


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Combiner(lambda items: items, max_batch=0)


class Alarm(Exception):
    pass


def _raise_alarm(signum: int, frame: object) -> None:
    raise Alarm


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX timers")
def test_a_waiter_interrupted_by_a_signal_leaves_and_stalls_nobody() -> None:
    # Given a leader held in send, and the main thread queued behind it
    combiner, gate, leader = held_leader()
    previous = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        # When a signal handler raises while the main thread waits
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Alarm):
            combiner.call("interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert combiner._queue == []  # its item was dropped

    # Then the leader finishes, stops leading, and later callers are served
    gate.set()
    leader.join(DEADLINE)
    assert not combiner._leading
    got: list[str] = []
    run_threads([lambda: got.append(combiner.call("later"))])
    assert got == ["ok"]
    assert combiner.items == 2  # the leader's item and the later one: the dropped one never went


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_send_starts_with_a_fresh_combiner_and_new_tokens() -> None:
    # Given a combiner leading a held send when the process forks
    combiner, gate, leader = held_leader()
    parent_token = tokens.new_token()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no leader thread exists here
        try:
            os.close(read)
            answer = combiner.call("child")  # hangs if the copied state were kept
            os.write(write, f"{answer} {tokens.new_token()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        try:
            wait_for(lambda: os.waitpid(pid, os.WNOHANG) != (0, 0), "the child to exit")
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the child's call hung") from None
        with os.fdopen(read) as pipe:
            answer, child_token = pipe.read().split()
    finally:
        gate.set()
        leader.join(DEADLINE)
    # Then the child's call was sent by the child itself, and its tokens differ from ours
    assert answer == "ok"
    assert child_token[:16] != parent_token[:16]
