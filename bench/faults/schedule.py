"""The seeded fault plan: which fault happens when, against which instance, down for how long.

A pure function of its arguments: the same seed gives the same plan, so a failing run can be
repeated. Every kind appears `repeats` times, in a shuffled order, spread over the window: one
slot each, sized by the kind's weight (a RocketMQ process takes about 30 s to be back in the
cluster, a RocketMQ 5 proxy longer, a killed Python process about 2 s), the fault at a random
point of its slot's first half, so its recovery has the rest.
"""

from __future__ import annotations

import dataclasses
import random

#: process kills (the role restarts after the down time)
PROCESS_KINDS = ("kill-producer", "kill-relay", "kill-consume", "kill-receipts")
#: faults of the services every transport uses
SERVICE_KINDS = ("redis-flush", "redis-kill", "mariadb-kill", "dup-storm")
#: `--db postgresql`: the run's PostgreSQL is killed in the place of its MariaDB
DB_KILL = {"mariadb": "mariadb-kill", "postgresql": "postgres-kill"}
#: faults of the RocketMQ broker's processes (on the SQL transport the broker is the database)
ROCKETMQ_KINDS = ("broker-kill", "namesrv-kill")
#: RocketMQ 5: the proxy holds the broker (local mode), so killing it kills both
ROCKETMQ5_KINDS = ("proxy-kill", "namesrv-kill")
#: the broker's kinds by transport
TRANSPORT_KINDS = {"rocketmq": ROCKETMQ_KINDS, "rocketmq5": ROCKETMQ5_KINDS}

#: how many instances each killed role has (the target is drawn among them)
INSTANCES = {"kill-producer": 1, "kill-relay": 2, "kill-consume": 2, "kill-receipts": 1}
#: down time range in seconds (kill -9 -> restart)
DOWN = {"kill": (0.5, 3.0), "redis-kill": (1.0, 4.0), "mariadb-kill": (1.0, 4.0),
        "postgres-kill": (1.0, 4.0), "broker-kill": (1.0, 4.0), "namesrv-kill": (1.0, 4.0),
        "proxy-kill": (1.0, 4.0)}
#: relative slot sizes (default 1)
WEIGHT = {"mariadb-kill": 1.5, "postgres-kill": 1.5, "broker-kill": 3.0, "namesrv-kill": 3.0,
          "proxy-kill": 3.0}


@dataclasses.dataclass(frozen=True)
class Fault:
    """One planned fault: `at` seconds after the flow started."""

    at: float
    kind: str
    target: int = 1
    down: float = 0.0


def kinds_for(transport: str, db: str = "mariadb") -> tuple[str, ...]:
    """Every fault kind that applies to `transport` (`sql`, `rocketmq` or `rocketmq5`) on `db`
    (`mariadb` or `postgresql`: its kill takes mariadb-kill's place, so a seed plans the same
    times on both).

    >>> kinds_for("rocketmq5")[-2:]
    ('proxy-kill', 'namesrv-kill')
    >>> kinds_for("sql", "postgresql")[4:]
    ('redis-flush', 'redis-kill', 'postgres-kill', 'dup-storm')
    """
    services = tuple(DB_KILL[db] if k == "mariadb-kill" else k for k in SERVICE_KINDS)
    return PROCESS_KINDS + services + TRANSPORT_KINDS.get(transport, ())


def plan(kinds: tuple[str, ...], *, repeats: int, start: float, end: float,
         seed: int) -> list[Fault]:
    """`repeats` faults of every kind between `start` and `end` seconds, ordered by time.

    >>> [f.kind for f in plan(("redis-flush",), repeats=2, start=0, end=10, seed=1)]
    ['redis-flush', 'redis-flush']
    """
    if end <= start or repeats < 1 or not kinds:
        raise ValueError("need end > start, repeats >= 1 and at least one kind")
    rng = random.Random(seed)
    order = [k for k in kinds for _ in range(repeats)]
    rng.shuffle(order)
    unit = (end - start) / sum(WEIGHT.get(k, 1.0) for k in order)
    faults = []
    slot_start = start
    for kind in order:
        slot = unit * WEIGHT.get(kind, 1.0)
        low, high = DOWN["kill"] if kind.startswith("kill-") else DOWN.get(kind, (0.0, 0.0))
        faults.append(Fault(
            at=round(slot_start + rng.uniform(0, slot / 2), 2),
            kind=kind,
            target=rng.randint(1, INSTANCES.get(kind, 1)),
            down=round(rng.uniform(low, high), 2),
        ))
        slot_start += slot
    return faults
