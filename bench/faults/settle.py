"""After the faults: let the system drain, then let the reconciler repair what is still stuck.

A drain ends when everything converged, when nothing moved for `quiet` seconds (the counts of
outbox states, effects and processed rows all unchanged), or at its deadline. What is left then
is classified (`checks.leftovers`: before the reconciler touches it) and `ckit reconcile --engine
sql` runs; its repairs (re-sends among them) get another drain, up to `MAX_ROUNDS` rounds.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.faults import checks, kit, world

MAX_ROUNDS = 3
POLL = 1.0
RECONCILE_TIMEOUT = 180.0


@dataclasses.dataclass
class Drain:
    """One drain: how it ended (`converged`, `quiet`, `deadline`), when, and when the counts
    last moved."""

    started: float
    ended: float
    reason: str
    snapshot: checks.Snapshot | None
    last_change: float


@dataclasses.dataclass
class Round:
    """One reconcile round: what was left before it, and what the reconciler did."""

    at: float
    before: dict[str, Any]
    classes: dict[str, dict[str, int]]
    exit_code: int
    seconds: float
    error: str = ""

    def applied(self, klass: str) -> int:
        return int(self.classes.get(klass, {}).get("applied", 0))


@dataclasses.dataclass
class Settled:
    drains: list[Drain]
    rounds: list[Round]
    converged_at: float | None

    @property
    def without_reconciler(self) -> bool:
        return self.converged_at is not None and not self.rounds

    def repaired(self) -> dict[str, int]:
        """Rows each repair class changed, summed over the rounds."""
        total: dict[str, int] = {}
        for r in self.rounds:
            for klass, counts in r.classes.items():
                total[klass] = total.get(klass, 0) + int(counts.get("applied", 0))
        return total


def drain(probe: Callable[[], checks.Snapshot | None], *, expected: int,
          clock: Callable[[], float], until: float, quiet: float) -> Drain:
    """Poll `probe` until converged, quiet for `quiet` seconds, or `until` (a clock value)."""
    started = clock()
    last_sig: tuple[Any, ...] | None = None
    last_change = started
    snap: checks.Snapshot | None = None
    while True:
        latest = probe()
        now = clock()  # after the probe: on a loaded machine the reads take seconds
        if latest is not None:
            snap = latest
            if snap.converged(expected):
                return Drain(started, now, "converged", snap, now)
            sig = (tuple(sorted(snap.states.items())), snap.effects, snap.processed)
            if sig != last_sig:
                last_sig, last_change = sig, now
            elif now - last_change >= quiet:
                return Drain(started, now, "quiet", snap, last_change)
        if now >= until:
            return Drain(started, now, "deadline", snap, last_change)
        time.sleep(POLL)


def reconcile(env: dict[str, str], inventory_url: str, out_dir: Path,
              stuck_after: float) -> tuple[dict[str, dict[str, int]], int, str]:
    """Run `ckit reconcile --engine sql` once; returns (classes, exit code, error line)."""
    argv = [*kit.CLI, "reconcile", "--engine", "sql", "--group",
            f"{world.GROUP}={inventory_url}", "--stuck-after", f"{max(1, round(stuck_after))}s",
            "--output", str(out_dir), "--json", "--quiet", "--no-fail-on-failures"]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=RECONCILE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {}, -1, f"ckit reconcile did not finish in {RECONCILE_TIMEOUT:g}s"
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        last = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return {}, proc.returncode, kit.mask(last[0])
    return summary.get("classes", {}), proc.returncode, ""


def settle(*, orders: Engine, inventory: Engine, expected: int, clock: Callable[[], float],
           deadline: float, quiet: float, stuck_after: float, env: dict[str, str],
           inventory_url: str, out_dir: Path, stormed: set[str],
           say: Callable[[str], None]) -> Settled:
    """Drain; while rows are stuck and rounds are left, reconcile and drain again."""

    def probe() -> checks.Snapshot | None:
        try:
            return checks.snapshot(orders, inventory)
        except sa.exc.DBAPIError:
            return None

    drains: list[Drain] = []
    rounds: list[Round] = []
    for n in range(MAX_ROUNDS + 1):
        d = drain(probe, expected=expected, clock=clock, until=deadline, quiet=quiet)
        drains.append(d)
        left = d.snapshot
        say(f"drain {n + 1} ended ({d.reason}) after {d.ended - d.started:.1f}s"
            + (f": {left.consumed}/{expected} CONSUMED, {left.distinct_effects} applied"
               if left else ""))
        if d.reason == "converged":
            return Settled(drains, rounds, d.ended)
        if n == MAX_ROUNDS or clock() >= deadline:
            break
        before = checks.leftovers(orders, inventory, stormed)
        say(f"before reconcile round {n + 1}: {before['by_state']}, SENT rows by cause "
            f"{before['sent_by_cause']}")
        began = clock()
        classes, code, error = reconcile(env, inventory_url, out_dir / f"round-{n + 1}",
                                         stuck_after)
        rounds.append(Round(began, before, classes, code, round(clock() - began, 1), error))
        applied = {k: v.get("applied", 0) for k, v in classes.items() if v.get("found")}
        say(f"reconcile round {n + 1}: exit {code}, found/applied "
            + (", ".join(f"{k} {classes[k].get('found')}/{a}" for k, a in applied.items())
               or "nothing") + (f" [{error}]" if error else ""))
    return Settled(drains, rounds, None)
