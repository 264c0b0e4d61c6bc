"""Fault injection on real services: the whole system as separate processes while things break.

    python bench/faults.py --transport sql                  # short: 1,000 orders, each kind once
    python bench/faults.py --transport rocketmq --seed 7
    python bench/faults.py --transport rocketmq5 --seed 7   # RocketMQ 5.3.3 proxy over gRPC
    python bench/faults.py --transport rocketmq --long      # 50,000 orders, each kind 5 times
    python bench/faults.py --transport sql --db postgresql  # on a PostgreSQL of its own

Starts its own MariaDB, Redis (and RocketMQ name server + broker, or for rocketmq5 a 5.x name
server + proxy with its broker inside) on loopback ports of their own (the shared services' ports
+ --port-offset) with their data in --dir, then as OS processes: a producer placing the orders
(order row + outbox row in one transaction, sent after commit, at a bounded rate), two `ckit
relay`, two `ckit consume bench.faults.app:app` (Redis + MariaDB dedupe; the handler writes an
effect row to a table without a unique key) and `ckit receipts`. Faults follow a seeded schedule:
kill -9 (and restart) of each process kind, Redis FLUSHALL, Redis / MariaDB / broker (rocketmq5:
proxy) / name server kill -9 and restart, duplicate storms (`ckit outbox retry --force` on a few
percent of the SENT and CONSUMED rows). Then it drains, runs `ckit reconcile --engine sql` on what
is still stuck (reporting it by class first), checks that nothing was lost or doubled, prints the
figures and one last line `ok: ...` or `FAIL: ...` (exit 1). The run folder keeps every process's
log, the reconciler's output and report.json; --long (or --timeline) also draws a timeline PNG.
With --db postgresql a PostgreSQL of its own (Debian's initdb + postgres, as the postgres user when
run as root) takes MariaDB's place for every database, and postgres-kill mariadb-kill's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults import kit, report
from bench.faults.scenario import Config, run
from bench.faults.services import ServiceError

SHORT = {"messages": 1000, "repeats": 1, "max_seconds": 340.0}
LONG = {"messages": 50_000, "repeats": 5, "max_seconds": 4800.0}
#: seconds the producer takes to place the orders (the faults fall inside): a RocketMQ name
#: server or broker takes about 30 s to be back in the cluster, so its runs get more room, and
#: a RocketMQ 5 proxy (a 1 GiB JVM with the broker inside) takes longer still to start
WINDOW = {("sql", False): 90.0, ("rocketmq", False): 150.0, ("rocketmq5", False): 200.0,
          ("sql", True): 900.0, ("rocketmq", True): 1200.0, ("rocketmq5", True): 1200.0}


def parse(argv: list[str]) -> Config:
    p = argparse.ArgumentParser(prog="python bench/faults.py", description=__doc__.split("\n")[0])
    p.add_argument("--transport", choices=("sql", "rocketmq", "rocketmq5"), required=True,
                   help="sql: the SQL transport on the run's MariaDB; rocketmq: a 4.9.7 name "
                        "server + broker; rocketmq5: a 5.3.3 name server + proxy (local mode) "
                        "through rocketmq-python-client 5.x")
    p.add_argument("--db", choices=("mariadb", "postgresql"), default="mariadb",
                   help="the run's own database server for the outbox, the processed table and "
                        "(sql) the transport's tables: mariadb (default) or postgresql (its "
                        "kill -9 is the postgres-kill fault)")
    p.add_argument("--long", action="store_true",
                   help="the bench run: 50,000 orders, every kind 5 times, over 900 s, timeline")
    p.add_argument("--messages", type=int, help="orders to place (short 1000, long 50000)")
    p.add_argument("--repeats", type=int, help="faults of each kind (short 1, long 5)")
    p.add_argument("--window", type=float,
                   help="seconds the producer takes; the faults fall inside (short: sql 90, "
                        "rocketmq 150, rocketmq5 200; long: 900, 1200, 1200)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    p.add_argument("--dir", type=Path, help="run folder (default /tmp/ckit-faults/...; new)")
    p.add_argument("--port-offset", type=int, default=10_000,
                   help="ports = the shared services' ports + this (default 10000)")
    p.add_argument("--max-seconds", type=float,
                   help="the whole run's deadline (short 340, long 4800, at least window + 240)")
    p.add_argument("--quiet", type=float, default=35.0,
                   help="a drain ends when nothing moved for this long (default 35)")
    p.add_argument("--stuck-after", type=float, default=10.0,
                   help="ckit reconcile --stuck-after, in seconds (default 10)")
    p.add_argument("--timeline", type=Path, help="write the timeline PNG here (--long: run "
                   "folder/timeline.png)")
    p.add_argument("--json", type=Path, help="write the report here (default run folder/"
                   "report.json)")
    p.add_argument("--relay-claim", choices=("lease", "lock"), default="lease",
                   help="the two relays' ckit relay --claim mode (default lease)")
    p.add_argument("--redis-claims", choices=("every", "adaptive"), default="every",
                   help="the consumers' ConsumerApp(redis_claims=...) (default every)")
    p.add_argument("--keep-services", action="store_true",
                   help="leave the run's MariaDB/Redis/RocketMQ (5) running (to inspect them)")
    a = p.parse_args(argv)
    base = LONG if a.long else SHORT
    messages = a.messages or base["messages"]
    window = a.window or WINDOW[(a.transport, a.long)]
    db = "" if a.db == "mariadb" else f"-{a.db}"
    run_dir = a.dir or Path("/tmp/ckit-faults") / (
        f"{a.transport}{db}-{time.strftime('%Y%m%d-%H%M%S')}-seed{a.seed}")
    if messages < 1 or window <= 0:
        p.error("--messages and --window must be positive")
    return Config(
        transport=a.transport, db=a.db, messages=messages,
        repeats=a.repeats or int(base["repeats"]),
        window=window, seed=a.seed, run_dir=run_dir, port_offset=a.port_offset,
        max_seconds=a.max_seconds or max(float(base["max_seconds"]), window + 240),
        quiet=a.quiet, stuck_after=a.stuck_after,
        timeline=a.timeline or (run_dir / "timeline.png" if a.long else None),
        json_path=a.json or run_dir / "report.json", keep_services=a.keep_services,
        relay_claim=a.relay_claim, redis_claims=a.redis_claims)


def _interrupt(signum: int, _frame: object) -> None:
    # a second SIGTERM (a supervisor that signals the group, then the runner) must not cut the
    # clean-up short: it would leave servers of the run behind
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    cfg = parse(argv)
    # SIGTERM unwinds like Ctrl-C: the run stops every process and service it started
    signal.signal(signal.SIGTERM, _interrupt)
    print(kit.mask(kit.machine_facts()))
    print(f"run     : {report.title(cfg)}; folder {cfg.run_dir}", flush=True)
    try:
        rep = run(cfg, out=lambda line: print(line, flush=True))
    except ServiceError as exc:
        print(f"FAIL: {exc}")
        return 1
    assert cfg.json_path is not None
    cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
    cfg.json_path.write_text(json.dumps(rep, indent=2, default=str))
    try:
        print("-" * 100)
        print(report.text(rep))
        print(f"report  : {cfg.json_path}" + (f"; timeline {rep['timeline_png']}"
                                              if "timeline_png" in rep else ""))
        print(rep["verdict"], flush=True)
    except BrokenPipeError:  # nothing reads the output any more: the report file has it all
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
