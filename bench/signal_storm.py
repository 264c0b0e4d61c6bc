"""Redis claims under a storm of signals on the main thread, beside consume threads claiming.

    python bench/signal_storm.py                                  # 20 s, every 1 ms, 4 threads
    python bench/signal_storm.py --url redis://127.0.0.1:6379/1   # SELECT 1 on every connect
    python bench/signal_storm.py --reconnect                      # every armed round reconnects
    python bench/signal_storm.py --plain-client                   # without client_options()

A child process (run with faulthandler, stopped after --seconds + 60 s) claims through one
`RedisDedupe` from --threads threads, each claiming new ids, and from its main thread, which
claims a new id (must answer CLAIMED) and an id another token holds (must answer BUSY), both
alone and as pending claims, round after round, while a SIGALRM handler raises on the main
thread every --interval seconds during the claims of odd rounds; even rounds run unarmed, so
each checks that an interrupted round left no answer behind. With --reconnect the main thread's
connections are dropped before each armed round, so its connect handshakes (`SELECT <db>`,
`HELLO 3`) run under fire too. Then the threads are stopped and joined (10 s each).
The last line is `ok: ...` when no answer was wrong, no thread hung and the child exited by
itself, else `FAIL: ...` (exit 1), with the child's first frames when it crashed. UNAVAILABLE
is not wrong: a connection an interrupt left unusable fails, Redis is counted down for 5 s and
the processed table decides meanwhile (their count is printed). The client is made as
`ConsumerApp` makes one from a URL (`consumer_kit.dedupe.packer.client_options()`, 0.5 s
socket timeout; redis-py's default RESP3). Do not run it beside the test suite: its tests
flush and disconnect the same Redis.

Before the main thread kept out of the combiner (see `docs/signals.md`) this hung every
consume thread; a claim interrupted between its send and its read left its answer for the
next claim. What a crash in redis-py's reconnect handshake means is said there too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average, machine_facts

JOIN_TIMEOUT = 10.0


class Alarm(BaseException):
    """What the storm's handler raises (like KeyboardInterrupt, not an Exception)."""


def storm(url: str, seconds: float, interval: float, threads: int, plain: bool,
          reconnect: bool) -> dict[str, Any]:
    """The child's work; returns its counts."""
    import redis

    from consumer_kit.dedupe import Claim, RedisDedupe
    from consumer_kit.dedupe.keys import lease_key
    from consumer_kit.dedupe.scripts import thread_connection

    # as ConsumerApp makes it from a URL
    options: dict[str, Any] = {}
    if not plain:
        from consumer_kit.dedupe.packer import client_options

        options = client_options()
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                  **options)
    store = RedisDedupe(client, f"storm-{uuid.uuid4().hex[:8]}")
    if store.claim("HELD", "other") is not Claim.CLAIMED:
        raise SystemExit("setup: the held id could not be claimed")
    stop = threading.Event()
    wrong: list[str] = []
    claims = [0] * threads
    degraded = [0] * (threads + 1)  # UNAVAILABLE: Redis counted down, the database decides

    def consume(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                answer = store.claim(f"t{n}-{i}", "me")
            except BaseException as exc:  # anything here is a finding
                wrong.append(f"thread {n} raised {exc!r}")
                continue
            if answer is Claim.UNAVAILABLE:
                degraded[n] += 1
            elif answer is not Claim.CLAIMED:
                wrong.append(f"thread {n}: new id answered {answer.name}")
            claims[n] += 1

    workers = [threading.Thread(target=consume, args=(n,), daemon=True) for n in range(threads)]
    for w in workers:
        w.start()
    armed = [False]

    def raise_alarm(signum: int, frame: object) -> None:
        if armed[0]:
            raise Alarm

    signal.signal(signal.SIGALRM, raise_alarm)
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    end = time.monotonic() + seconds
    rounds = completed = interrupted = 0
    while time.monotonic() < end:
        rounds += 1
        try:
            if reconnect and rounds % 2 == 1:  # this round's claims connect under fire
                for use in ("alone", "claims"):
                    thread_connection(client.connection_pool, use).disconnect()
            armed[0] = rounds % 2 == 1  # the handler raises only inside these claims
            got = (store.claim(f"m-{rounds}", "me"), store.claim("HELD", "me"),
                   store.claim_later(f"p-{rounds}", "me").result(),
                   store.claim_later("HELD", "me").result())
            armed[0] = False
        except Alarm:
            armed[0] = False
            interrupted += 1
            continue
        completed += 1
        for answer, owed in zip(got, (Claim.CLAIMED, Claim.BUSY, Claim.CLAIMED, Claim.BUSY)):
            if answer is Claim.UNAVAILABLE:
                degraded[threads] += 1
            elif answer is not owed:
                wrong.append(f"main: {answer.name} where {owed.name} was owed")
    signal.setitimer(signal.ITIMER_REAL, 0)
    stop.set()
    for w in workers:
        w.join(JOIN_TIMEOUT)
    held = redis.Redis.from_url(url).get(lease_key(store.group, "HELD"))
    if held != b"other":  # then a BUSY expected above was not owed: the run says nothing
        wrong.append(f"the held lease is {held!r}, not b'other': something else flushed Redis")
    return {"main_rounds": rounds, "main_completed": completed, "main_interrupted": interrupted,
            "thread_claims": sum(claims), "degraded": sum(degraded), "wrong": wrong[:5],
            "wrong_count": len(wrong), "hung": sum(w.is_alive() for w in workers)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python bench/signal_storm.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("CKIT_TEST_REDIS_URL",
                                                   "redis://127.0.0.1:6379/0"))
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=0.001, help="seconds between signals")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--plain-client", action="store_true",
                   help="without client_options(): redis-py's packer and handshake")
    p.add_argument("--reconnect", action="store_true",
                   help="drop the main thread's connections before each armed round")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.interval <= 0 or args.threads < 1:
        p.error("--seconds and --interval must be positive, --threads at least 1")
    if args.child:
        print(json.dumps(storm(args.url, args.seconds, args.interval, args.threads,
                               args.plain_client, args.reconnect)), flush=True)
        os._exit(0)  # the daemon threads of a hung run must not hold the exit
    print(machine_facts())
    import redis

    print(f"redis-py {redis.__version__}, hiredis {redis.utils.HIREDIS_AVAILABLE}")
    child = [sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()), "--child",
             *(argv if argv is not None else sys.argv[1:])]
    try:
        run = subprocess.run(child, capture_output=True, text=True, timeout=args.seconds + 60)
    except subprocess.TimeoutExpired:  # subprocess.run killed it (its own child, by PID)
        print(f"FAIL: the storm did not end within {args.seconds + 60:.0f} s")
        raise SystemExit(1) from None
    print(f"load average at the end: {load_average()}")
    if run.returncode != 0:
        how = (f"died of {signal.Signals(-run.returncode).name}" if run.returncode < 0
               else f"exited {run.returncode}")
        lines = run.stderr.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
        print("\n".join(line for line in lines[start:start + 9]))
        print(f"FAIL: the storm process {how} (the crashing thread's frames above; "
              "docs/signals.md)")
        raise SystemExit(1)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"main thread: {result['main_rounds']:,} rounds of 4 claims, "
          f"{result['main_completed']:,} completed, {result['main_interrupted']:,} interrupted; "
          f"{args.threads} threads: {result['thread_claims']:,} claims; answered UNAVAILABLE "
          f"(Redis counted down after an error, the processed table decides): "
          f"{result['degraded']:,}")
    if result["wrong_count"] or result["hung"]:
        print(f"FAIL: {result['wrong_count']} wrong answers {result['wrong']}, "
              f"{result['hung']} threads hung")
        raise SystemExit(1)
    print(f"ok: {args.seconds:.0f} s of SIGALRM every {args.interval * 1000:g} ms on the main "
          f"thread: no wrong answer, no thread hung")


if __name__ == "__main__":
    main()
