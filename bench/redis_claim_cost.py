"""What one Redis claim costs, on the client and in the Redis server, against a PING.

    python bench/redis_claim_cost.py [--redis-url redis://127.0.0.1:6379/0] [--calls 10000]
                                     [--runs 3]

Why the default `redis_claims="every"` adds more to a decorated handler than its round trip
(which the pending claim overlaps with the processed row's INSERT): each claim also costs CPU,
in this process (packing, the send and read system calls, parsing the answer) and in the Redis
server (reading, running the script, answering). On a machine whose cores the consumer, the
database and Redis share, that CPU is time taken from the others. Each variant runs `--calls`
times on one thread (runs interleaved, medians), new message ids every call:

- PING: the least any command costs, both sides (the baseline of the ratios);
- SET NX PX: one plain command;
- the claim alone (`RedisDedupe.claim`: one EVALSHA of claim.lua), as a duplicate-path claim;
- the claim with the previous message's done marker riding on it (`RedisDedupe.finish`, then
  `claim_later(...).result()`): what the pipeline does per message by default;
- a what-if, not consumer-kit's code: that claim and marker as three plain commands in one
  pipeline (SET done PX; EXISTS done; SET lease NX PX GET, Redis 7 or later). It shows what
  the Lua script itself costs; it would not delete our lease with the marker, and Redis 6.2
  refuses NX with GET.

Client CPU is this process's (`time.process_time`, the writer thread included); server CPU is
the change of `used_cpu_user + used_cpu_sys` in `INFO cpu` over the loop, so it includes
anything else the server did meanwhile (other clients of a shared server, its cron): compare
it with the PING row of the same run. Keys are deleted after each run (never a flush).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.common import load_average, machine_facts, parse_counts, table
from consumer_kit.core.urls import mask_url
from consumer_kit.dedupe.keys import done_key, lease_key
from consumer_kit.dedupe.packer import client_options
from consumer_kit.dedupe.redis_store import RedisDedupe
from consumer_kit.dedupe.scripts import release_kept, thread_connection

#: (wall, client CPU, server CPU), seconds per call
Cost = tuple[float, float, float]


def server_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the Redis server has used (user + system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Variants:
    """The variants' per-call functions, on one RedisDedupe of a group of this run's own."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.group = f"bench-claimcost-{run}"
        self.dedupe = RedisDedupe(client, self.group)
        self.token = "t" * 32
        self.ids: list[str] = []
        self.previous: str | None = None
        self.conn: Any = None

    def calls(self) -> dict[str, Callable[[str], None]]:
        """Name -> function of a new message id."""
        return {
            "PING": self.ping,
            "SET NX PX": self.set_nx,
            "claim alone (EVALSHA)": self.claim_alone,
            "claim + done marker (per message, default)": self.claim_with_marker,
            "what-if: the same as 3 plain commands": self.plain,
        }

    def _on_conn(self, *command: str) -> Any:
        if self.conn is None:
            self.conn = thread_connection(self.client.connection_pool, "bench")
        self.conn.send_command(*command)
        return self.conn.read_response()

    def ping(self, message_id: str) -> None:
        self._on_conn("PING")

    def set_nx(self, message_id: str) -> None:
        self.ids.append(message_id)
        self._on_conn("SET", lease_key(self.group, message_id), self.token, "NX", "PX", "120000")

    def claim_alone(self, message_id: str) -> None:
        self.ids.append(message_id)
        self.dedupe.claim(message_id, self.token)

    def claim_with_marker(self, message_id: str) -> None:
        self.ids.append(message_id)
        if self.previous is not None:
            self.dedupe.finish(self.previous, self.token)
        self.dedupe.claim_later(message_id, self.token).result()
        self.previous = message_id

    def plain(self, message_id: str) -> None:
        self.ids.append(message_id)
        if self.conn is None:
            self.conn = thread_connection(self.client.connection_pool, "bench")
        commands: list[tuple[str, ...]] = []
        if self.previous is not None:
            commands.append(("SET", done_key(self.group, self.previous), "1", "PX",
                             str(self.dedupe.done_ms)))
        commands += [("EXISTS", done_key(self.group, message_id)),
                     ("SET", lease_key(self.group, message_id), self.token, "NX", "PX",
                      str(self.dedupe.lease_ms), "GET")]
        self.conn.send_packed_command(self.conn.pack_commands(commands))
        for _ in commands:
            self.conn.read_response()
        self.previous = message_id

    def clean(self) -> None:
        """Send what the writer still holds, then delete every key this run made."""
        self.dedupe.flush(30)
        self.dedupe.close()
        for start in range(0, len(self.ids), 500):
            names: list[str] = []
            for message_id in self.ids[start:start + 500]:
                names += [done_key(self.group, message_id), lease_key(self.group, message_id)]
            self.client.delete(*names)
        self.ids.clear()


def timed(client: redis.Redis, call: Callable[[str], None], prefix: str, calls: int) -> Cost:
    """Run `call` for `calls` new ids (after 200 to warm up); per-call costs."""
    for i in range(200):
        call(f"{prefix}w{i}")
    server = server_cpu(client)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        call(f"{prefix}{i}")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / calls, cpu / calls, (server_cpu(client) - server) / calls


def measure(client: redis.Redis, calls: int, runs: int) -> dict[str, list[Cost]]:
    """Every variant once per run, the order rotated run by run."""
    costs: dict[str, list[Cost]] = {}
    for run in range(runs):
        variants = Variants(client, f"{os.getpid()}-{int(time.time())}-{run}")
        named = variants.calls()
        order = list(named)[run % len(named):] + list(named)[:run % len(named)]
        try:
            for name in order:
                variants.previous = None
                try:
                    costs.setdefault(name, []).append(
                        timed(client, named[name], f"{order.index(name)}-", calls))
                except redis.ResponseError as exc:  # e.g. Redis 6.2: NX with GET
                    print(f"  {name}: skipped, Redis refused it: {exc}")
                    costs[name] = []
        finally:
            variants.clean()
        print(f"  run {run + 1}/{runs}: " + ", ".join(
            f"{name.split(' (')[0]} {cost[-1][0] * 1e6:.1f} us" for name, cost in costs.items()
            if cost))
    return costs


def report(costs: dict[str, list[Cost]]) -> str:
    """The medians and their ratios to PING's."""
    def median(name: str, i: int) -> float:
        return statistics.median(c[i] for c in costs[name])

    rows = []
    for name, cost in costs.items():
        if not cost:
            continue
        wall, client, server = (median(name, i) for i in range(3))
        rows.append([name, f"{wall * 1e6:.1f}", f"{client * 1e6:.1f}", f"{server * 1e6:.1f}",
                     f"{(client + server) * 1e6:.1f}",
                     f"{(client + server) / (median('PING', 1) + median('PING', 2)):.2f}x"])
    return table(["call", "wall us", "client CPU us", "server CPU us", "CPU us, both",
                  "x PING's CPU"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get(
        "CKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--calls", type=int, default=10_000, help="calls per run and variant")
    args = parse_counts(parser, argv, "--calls")
    client = redis.Redis.from_url(args.redis_url, socket_timeout=5, socket_connect_timeout=5,
                                  **client_options())
    try:
        version = client.info("server")["redis_version"]
    except redis.RedisError as exc:
        parser.exit(2, f"redis_claim_cost: Redis at {mask_url(args.redis_url)} did not answer: "
                       f"{exc}\n")
    print(machine_facts())
    print(f"redis   : {version} at {mask_url(args.redis_url)}")
    result: dict[str, list[Cost]] = {}
    failure: list[BaseException] = []

    def work() -> None:  # a thread of its own, as a consume thread (not the main thread)
        try:
            result.update(measure(client, args.calls, args.runs))
        except BaseException as exc:
            failure.append(exc)
        finally:
            release_kept(client.connection_pool)

    thread = threading.Thread(target=work, name="bench-claims")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    print(f"medians of {args.runs} runs x {args.calls} calls, per call:")
    print(report(result))
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
