"""Carrying out one planned fault, and the record of what happened.

Process kills SIGKILL one role and start it again after the planned down time; service kills do
the same to the run's own MariaDB (or PostgreSQL), Redis, name server, broker or RocketMQ 5 proxy
(never the shared ones; the proxy holds its broker); a Redis
flush is FLUSHALL on the run's Redis; a duplicate storm puts a few percent of the SENT and
CONSUMED outbox rows back to PENDING with the operator's command (`ckit outbox retry --force`), so
the relays send the same message ids again.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from bench.faults import kit, world
from bench.faults.mariadb import MariaDB
from bench.faults.postgres import PostgreSQL
from bench.faults.processes import Supervisor
from bench.faults.schedule import DB_KILL, Fault
from bench.faults.services import Redis, RocketMQ

STORM_SHARE = 0.03
STORM_MAX = 2_000
CLI_TIMEOUT = 120.0


class InjectError(RuntimeError):
    """A fault could not be carried out (the run fails: a fault that did not happen proves
    nothing)."""


@dataclasses.dataclass
class FaultRecord:
    """What one fault did: when (seconds into the run), to what, and how long recovery took."""

    planned_at: float
    at: float
    kind: str
    target: str
    pid: int | None = None
    down: float = 0.0
    restarted_at: float | None = None
    new_pid: int | None = None
    rows: int | None = None  # dup-storm: rows put back to PENDING
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self) -> str:
        what = f"fault {self.kind:<13} {self.target:<10}"
        if self.pid is not None:
            what += f" pid {self.pid}"
        if self.rows is not None:
            what += f" {self.rows} rows back to PENDING"
        if self.restarted_at is not None:
            what += (f" down {self.down:.1f}s, up again after {self.restarted_at - self.at:.1f}s"
                     + (f" (pid {self.new_pid})" if self.new_pid else ""))
        return what + (f"  [{self.note}]" if self.note else "")


class Injector:
    """Applies faults to the run's processes and services."""

    def __init__(self, *, supervisor: Supervisor, database: MariaDB | PostgreSQL, redis: Redis,
                 rocketmq: RocketMQ | None, orders_url: str, clock: Callable[[], float],
                 seed: int, cli_env: dict[str, str]) -> None:
        self.supervisor = supervisor
        #: the run's MariaDB (mariadb-kill) or PostgreSQL (postgres-kill)
        self.database = database
        self.redis = redis
        self.rocketmq = rocketmq
        self.orders_url = orders_url
        self.clock = clock
        self.rng = random.Random(seed ^ 0x5EED)
        self.cli_env = cli_env
        #: message ids put back to PENDING by duplicate storms
        self.stormed: set[str] = set()

    def apply(self, fault: Fault) -> FaultRecord:
        """Carry out `fault` now; returns its record (the restart included)."""
        rec = FaultRecord(planned_at=fault.at, at=self.clock(), kind=fault.kind, target="",
                          down=fault.down)
        if fault.kind.startswith("kill-"):
            self._kill_process(fault, rec)
        elif fault.kind == "redis-flush":
            rec.target = "redis"
            self.redis.flushall()
        elif fault.kind == "dup-storm":
            rec.target = "outbox"
            self._storm(rec)
            rec.note += f"; the storm took {self.clock() - rec.at:.1f}s"
        else:
            self._kill_service(fault, rec)
        return rec

    def _kill_process(self, fault: Fault, rec: FaultRecord) -> None:
        kind = fault.kind.removeprefix("kill-")
        name = f"{kind}-{fault.target}"
        rec.target = name
        if self.supervisor.procs[name].finished:
            rec.note = "skipped: the role had finished"
            return
        rec.pid = self.supervisor.kill9(name)
        if rec.pid is None:
            rec.note = "was not running (restarting after an unplanned exit)"
        time.sleep(fault.down)
        rec.new_pid = self.supervisor.start(name)
        rec.restarted_at = self.clock()

    def _kill_service(self, fault: Fault, rec: FaultRecord) -> None:
        if fault.kind == "redis-kill":
            rec.target = "redis"
            rec.pid = self.redis.kill9()
            time.sleep(fault.down)
            self.redis.start()
            rec.new_pid = self.redis.pid
        elif fault.kind in ("mariadb-kill", "postgres-kill"):
            if fault.kind != DB_KILL[self.database.name]:
                raise InjectError(f"{fault.kind} does not apply to this run's database")
            rec.target = self.database.name
            rec.pid = self.database.kill9()
            time.sleep(fault.down)
            self.database.start()
            rec.new_pid = self.database.pid
        elif fault.kind in ("broker-kill", "namesrv-kill", "proxy-kill"):
            component = fault.kind.removesuffix("-kill")
            if self.rocketmq is None or component not in self.rocketmq.COMPONENTS:
                raise InjectError(f"{fault.kind} does not apply to this run's transport")
            rec.target = component
            rec.pid = self.rocketmq.kill9(component)
            time.sleep(fault.down)
            self.rocketmq.start()
            rec.new_pid = self.rocketmq.pid(component)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")
        rec.restarted_at = self.clock()

    def _storm(self, rec: FaultRecord) -> None:
        engine = world.engine(self.orders_url)
        outbox = sa.table(kit.OUTBOX_TABLE, sa.column("id"), sa.column("message_id"),
                          sa.column("state"))
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.select(outbox.c.id, outbox.c.message_id).where(
                    outbox.c.state.in_([kit.SENT, kit.CONSUMED]))).all()
        finally:
            engine.dispose()
        count = min(STORM_MAX, max(1, round(len(rows) * STORM_SHARE))) if rows else 0
        picked = self.rng.sample(rows, count) if count else []
        if not picked:
            rec.rows = 0
            rec.note = "no SENT or CONSUMED rows yet"
            return
        began = time.monotonic()
        proc = subprocess.run(
            [*kit.CLI, "outbox", "retry", "--force", "--json",
             *(kit.ROW_TARGET.format(r.id) for r in picked)],
            env=self.cli_env, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False)
        rec.note = f"ckit outbox retry took {time.monotonic() - began:.1f}s"
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise InjectError("ckit outbox retry failed ({}): {}".format(
                proc.returncode, kit.mask(proc.stderr.strip().splitlines()[-1]
                                          if proc.stderr.strip() else "no output"))) from None
        changed = set(result.get("changed", []))
        rec.rows = len(changed)
        self.stormed.update(r.message_id for r in picked if r.id in changed)
        refused = len(result.get("refused", []))
        if refused:
            rec.note += f"; {refused} rows moved meanwhile (refused)"
