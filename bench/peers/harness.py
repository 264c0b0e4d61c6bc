"""What every runner shares: the job it is given, the result it prints, and the three timing
protocols (publish, drain, dedupe). Standard library only: this module runs inside each peer's
own virtual environment, next to that peer and nothing else.

A runner is started as `<venv>/bin/python -m bench.peers.runners.<peer>`; it reads one JSON job
from stdin (`measure`, `db`, `url`, `prefix` and the measure's parameters; the URL carries the
password, which is why it travels on stdin and never on the command line), prints progress to
stderr and one line `PEERS-RESULT {json}` to stdout.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

T = TypeVar("T")

RESULT_MARK = "PEERS-RESULT "


@dataclass(frozen=True)
class Db:
    """Connection facts parsed from a SQLAlchemy URL (`mysql+pymysql://u:p@h:3306/db`)."""

    kind: str  # "mysql" or "postgresql"
    host: str
    port: int
    user: str
    password: str
    name: str

    @classmethod
    def from_url(cls, url: str) -> Db:
        parts = urlsplit(url)
        scheme = parts.scheme.split("+")[0]
        kind = "postgresql" if scheme.startswith("postgres") else "mysql"
        return cls(kind=kind, host=parts.hostname or "127.0.0.1",
                   port=parts.port or (5432 if kind == "postgresql" else 3306),
                   user=unquote(parts.username or ""), password=unquote(parts.password or ""),
                   name=parts.path.lstrip("/"))

    def dsn(self) -> str:
        """A libpq/asyncpg DSN (PostgreSQL only)."""
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.name}"


def read_job() -> dict[str, Any]:
    """The job the coordinator wrote on stdin."""
    return dict(json.loads(sys.stdin.read()))


def emit(result: dict[str, Any]) -> None:
    """Print the result line the coordinator parses (always the last stdout line)."""
    sys.stdout.write(RESULT_MARK + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def say(text: str) -> None:
    """Progress for the coordinator's log (stderr)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (what the table prints)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


# -- publish -----------------------------------------------------------------------------------
#
# Each variant is one whole business transaction (begin, INSERT the business row, maybe the
# message, commit), called with a key unique in the run. The variants of a peer run interleaved,
# transaction by transaction in rotating order, so machine noise (another engineer's load, an
# fsync stall) hits them alike; a run is N transactions of each; the figure of a run is the mean
# milliseconds per transaction; the coordinator takes medians over the runs.

Variant = Callable[[str], None]
AsyncVariant = Callable[[str], Awaitable[None]]


def publish_runs(variants: Sequence[tuple[str, Variant]], n: int, runs: int,
                 warmup: int = 50, label: str = "publish") -> list[dict[str, float]]:
    """Mean ms per transaction of each variant, one dict per run."""
    for i in range(warmup):
        for name, fn in variants:
            fn(f"w{i}-{name}")
    out = []
    k = len(variants)
    for run in range(runs):
        total = dict.fromkeys((name for name, _ in variants), 0.0)
        for i in range(n):
            for j in range(k):
                name, fn = variants[(i + j) % k]
                t0 = time.perf_counter()
                fn(f"r{run}-{i}")
                total[name] += time.perf_counter() - t0
        out.append({name: s * 1000 / n for name, s in total.items()})
        say(f"  {label} run {run + 1}/{runs}: "
            + ", ".join(f"{name} {ms:.3f} ms" for name, ms in out[-1].items()))
    return out


async def publish_runs_async(variants: Sequence[tuple[str, AsyncVariant]], n: int, runs: int,
                             warmup: int = 50) -> list[dict[str, float]]:
    """`publish_runs` for coroutine variants (asyncpg, SQLAlchemy asyncio)."""
    for i in range(warmup):
        for name, fn in variants:
            await fn(f"w{i}-{name}")
    out = []
    k = len(variants)
    for run in range(runs):
        total = dict.fromkeys((name for name, _ in variants), 0.0)
        for i in range(n):
            for j in range(k):
                name, fn = variants[(i + j) % k]
                t0 = time.perf_counter()
                await fn(f"r{run}-{i}")
                total[name] += time.perf_counter() - t0
        out.append({name: s * 1000 / n for name, s in total.items()})
        say(f"  publish run {run + 1}/{runs}: "
            + ", ".join(f"{name} {ms:.3f} ms" for name, ms in out[-1].items()))
    return out


# -- drain -------------------------------------------------------------------------------------
#
# `fill(n)` writes n pending rows (untimed, the peer's own fast path); `drain(setting, n)` runs
# the peer's relay until those n rows are sent and marked, and returns (seconds, rows sent).
# Every setting is tried once on `sweep_rows`; the fastest is then run `runs` times on `rows`,
# except that a relay too slow to drain `rows` within `budget` seconds gets a smaller backlog
# (rate x budget, at least `sweep_rows`) so the whole bench stays bounded: the result says so.

Fill = Callable[[int], None]
Drain = Callable[[dict[str, Any], int], tuple[float, int]]


def drain_runs(job: dict[str, Any], fill: Fill, drain: Drain) -> dict[str, Any]:
    """Sweep the settings, then time the best one; the result the coordinator prints."""
    settings: list[dict[str, Any]] = job["settings"]
    sweep_rows = int(job["sweep_rows"])
    sweep = []
    for setting in settings:
        fill(sweep_rows)
        seconds, sent = drain(setting, sweep_rows)
        _check_sent(sent, sweep_rows, setting)
        sweep.append({"setting": setting, "rows": sweep_rows, "seconds": seconds,
                      "rate": sweep_rows / seconds})
        say(f"  sweep {setting}: {sweep_rows / seconds:,.0f} rows/s")
    best = max(sweep, key=lambda s: s["rate"])
    rows = int(job["rows"])
    reduced = False
    if best["rate"] * float(job["budget"]) < rows:
        rows = max(sweep_rows, int(best["rate"] * float(job["budget"])))
        reduced = True
    timed = []
    if len(settings) == 1 and rows == sweep_rows and int(job["runs"]) > 0:
        timed.append(best)  # the sweep run already is a run of the best setting on these rows
    while len(timed) < int(job["runs"]):
        fill(rows)
        seconds, sent = drain(best["setting"], rows)
        _check_sent(sent, rows, best["setting"])
        timed.append({"setting": best["setting"], "rows": rows, "seconds": seconds,
                      "rate": rows / seconds})
        say(f"  run {len(timed)}: {rows:,} rows in {seconds:.2f} s = {rows / seconds:,.0f} rows/s")
    return {"sweep": sweep, "best": best["setting"], "runs": timed, "rows": rows,
            "reduced": reduced}


def _check_sent(sent: int, expected: int, setting: dict[str, Any]) -> None:
    if sent != expected:
        raise SystemExit(f"drain {setting}: {sent} rows sent, expected {expected}")


def run_async(coro: Awaitable[Any]) -> Any:
    """asyncio.run for a coroutine (kept here so runners stay short)."""
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- dedupe ------------------------------------------------------------------------------------
#
# A handler inserting one row, bare (its own transaction) and decorated (the peer's idempotent
# consumer), interleaved message by message like publish; then duplicates: messages already
# processed, delivered again, rejected per second.

def dedupe_runs(variants: Sequence[tuple[str, Variant]], n: int, runs: int,
                warmup: int = 50) -> list[dict[str, float]]:
    """Mean ms per message of each handler variant, one dict per run (fresh message ids)."""
    return publish_runs(variants, n, runs, warmup, label="dedupe")


#: duplicates each mode rejects untimed before `duplicate_rates` starts its clock
DUPLICATE_WARMUP = 50


def duplicate_rates(modes: Sequence[tuple[str, Callable[[str], None]]], keys: Sequence[str],
                    runs: int, warmup: int = DUPLICATE_WARMUP
                    ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Deliver every already-processed key once more through each mode; duplicates rejected
    per second, the median of `runs` runs, and every run's rate (by mode). The modes take
    turns in rotating order run by run, so that background load meets them alike (one pass
    per mode in a fixed order read up to 1.6x apart for the same code path on this shared
    machine). Each mode first rejects the first `warmup` keys untimed (connections opened, a
    consumer's duplicate-rate estimate settled): the first timed pass used to read 30% slower
    than the others."""
    rates: dict[str, list[float]] = {name: [] for name, _ in modes}
    for _, deliver in modes:
        for key in keys[:warmup]:
            deliver(key)
    for run in range(runs):
        turn = run % len(modes)
        for name, deliver in [*modes[turn:], *modes[:turn]]:
            t0 = time.perf_counter()
            for key in keys:
                deliver(key)
            rates[name].append(len(keys) / (time.perf_counter() - t0))
        say(f"  duplicates run {run + 1}/{runs}: " + ", ".join(
            f"{name} {found[-1]:,.0f}/s" for name, found in rates.items()))
    return {name: statistics.median(found) for name, found in rates.items()}, rates


def on_thread(fn: Callable[[], T]) -> T:
    """`fn()` run on a thread of its own, as a consume thread runs a delivery (consumer-kit's
    claims on the main thread take another path: docs/signals.md); its exception is raised
    here."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=run, name="consume", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return out[0]


def duplicates_sent(keys: Sequence[str], runs: int) -> int:
    """How many duplicates `duplicate_rates` delivers through each mode (warm-up included): what
    a runner checks its consumer counted or acked."""
    return len(keys) * runs + min(len(keys), DUPLICATE_WARMUP)
