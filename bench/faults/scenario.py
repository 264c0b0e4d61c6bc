"""One fault run from start to end: services, tables, processes, faults, settle, checks, report.

Every phase is bounded by the run's deadline (`max_seconds`); the run stops by itself, stops every
process and service it started, and returns the report (`report.build`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.faults import checks, kit, report, schedule, settle, timeline, world
from bench.faults.inject import FaultRecord, InjectError, Injector
from bench.faults.mariadb import MariaDB
from bench.faults.postgres import PostgreSQL
from bench.faults.postgres import missing_programs as missing_postgres
from bench.faults.processes import Proc, Supervisor
from bench.faults.services import (
    Ports,
    Redis,
    RocketMQ,
    RocketMQ5,
    ServiceError,
    check_ports_free,
    missing_programs,
)

ROOT = Path(__file__).resolve().parents[2]
STOP_RESERVE = 60.0  # seconds of the deadline kept for stopping everything


@dataclasses.dataclass
class Config:
    """What one run does (`bench/faults.py --help` documents each option)."""

    transport: str = "sql"
    #: the run's database server: `mariadb` or `postgresql`
    db: str = "mariadb"
    messages: int = 1000
    repeats: int = 1
    window: float = 90.0
    seed: int = 1
    run_dir: Path = Path("/tmp/ckit-faults/run")
    port_offset: int = 10_000
    max_seconds: float = 330.0
    quiet: float = 35.0
    stuck_after: float = 10.0
    timeline: Path | None = None
    json_path: Path | None = None
    keep_services: bool = False
    #: the relays' `ckit relay --claim` mode
    relay_claim: str = "lease"
    #: the consumers' `ConsumerApp(redis_claims=...)`
    redis_claims: str = "every"

    @property
    def rate(self) -> float:
        return self.messages / self.window


class Run:
    """The state of one run (services, processes, records) while it goes."""

    def __init__(self, cfg: Config, out: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.out = out
        self.wall0 = time.time()
        self.flow0: float | None = None  # wall time the producer started
        self.ports = Ports(cfg.port_offset)
        d = cfg.run_dir
        self.database: MariaDB | PostgreSQL = (
            PostgreSQL(d / "postgresql", self.ports.postgresql) if cfg.db == "postgresql"
            else MariaDB(d / "mariadb", self.ports.mariadb))
        self.redis = Redis(d / "redis", self.ports.redis)
        self.rocketmq: RocketMQ | None = None
        if cfg.transport == "rocketmq":
            self.rocketmq = RocketMQ(d / "rocketmq", self.ports.namesrv, self.ports.broker)
        elif cfg.transport == "rocketmq5":
            self.rocketmq = RocketMQ5(d / "rocketmq5", self.ports.namesrv5, self.ports.broker5,
                                      self.ports.proxy)
        self.urls = world.Urls(self.database.port, self.redis.url, world.transport_url(
            cfg.transport, db_port=self.database.port,
            namesrv_port=self.ports.namesrv5 if cfg.transport == "rocketmq5" else
            self.ports.namesrv, proxy_port=self.ports.proxy, db_kind=cfg.db), cfg.db)
        self.supervisor = Supervisor(self.clock, self.say)
        self.records: list[FaultRecord] = []
        self.errors: list[str] = []
        self.stopped_at: float | None = None  # clock() when the processes were told to stop
        self.dead_letters: dict[str, Any] | None = None
        self.out_lost = False  # the output's reader went away (`say`)

    def clock(self) -> float:
        """Seconds since the producer started (since the run started, before that)."""
        return time.time() - (self.flow0 or self.wall0)

    def say(self, line: str) -> None:
        """Print one progress line. When nothing reads the output any more (a parent killed,
        a `| head` done), the line goes to the run folder's `progress.log` instead: the run
        goes on to its end and its clean-up, which must stop every server it started."""
        stamp = f"[{self.clock():7.1f}s]" if self.flow0 else "[  setup ]"
        if not self.out_lost:
            try:
                self.out(f"{stamp} {line}")
                return
            except OSError:  # BrokenPipeError, EIO: the reader is gone
                self.out_lost = True
        with contextlib.suppress(OSError), open(self.cfg.run_dir / "progress.log", "a") as f:
            f.write(f"{stamp} {line}\n")

    @property
    def deadline(self) -> float:
        """The deadline as a value of `clock()`."""
        return self.wall0 + self.cfg.max_seconds - STOP_RESERVE - (self.flow0 or self.wall0)

    # -- phases ---------------------------------------------------------------------------

    def start_services(self) -> None:
        missing = missing_programs(self.cfg.transport, self.cfg.db)
        if self.cfg.db == "postgresql":
            missing += missing_postgres()
        if missing:
            raise ServiceError(f"missing {', '.join(missing)}: run scripts/setup.sh")
        check_ports_free(self.ports.all(self.cfg.transport, self.cfg.db))
        db = self.database
        db.install()
        db.start()
        db.provision(world.DATABASES, world.DB_USER, world.DB_PASSWORD)
        self.redis.start()
        server = "PostgreSQL" if isinstance(db, PostgreSQL) else "MariaDB"
        self.say(f"{server} {db.version()} on 127.0.0.1:{db.port}, "
                 f"Redis {self.redis.version()} on 127.0.0.1:{self.ports.redis}")
        if isinstance(self.rocketmq, RocketMQ5):
            began = time.monotonic()
            self.rocketmq.start()
            self.say(f"RocketMQ 5 name server {self.rocketmq.addr}, proxy (gRPC) "
                     f"{self.rocketmq.proxy_addr} with its broker 127.0.0.1:"
                     f"{self.rocketmq.broker_port} up in {time.monotonic() - began:.1f}s")
        elif self.rocketmq is not None:
            began = time.monotonic()
            self.rocketmq.start()
            self.say(f"RocketMQ name server 127.0.0.1:{self.ports.namesrv}, broker "
                     f"127.0.0.1:{self.ports.broker} up in {time.monotonic() - began:.1f}s")
        world.create_tables(self.urls, sql_transport=self.cfg.transport == "sql")
        self.create_topics()

    def create_topics(self) -> None:
        """The order and receipt topics (RocketMQ 5: NORMAL topics, created through the name
        server), and on RocketMQ 5 the consumer group with its retry limit and `%DLQ%group`
        before any consumer starts."""
        rocketmq5 = self.cfg.transport == "rocketmq5"
        options = {"max_reconsume_times": world.GROUP_RETRIES} if rocketmq5 else {}
        transport = kit.open_transport(self.urls.transport, **options)
        try:
            for topic in (world.TOPIC, world.RECEIPT_TOPIC):
                transport.ensure_topic(topic)
            if isinstance(transport, kit.RocketMQ5Transport):
                transport.prepare_group(world.GROUP)
                self.say(f"group {world.GROUP}: retryMaxTimes {world.GROUP_RETRIES}, "
                         f"%DLQ%{world.GROUP} created")
        finally:
            transport.close()

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        home = self.cfg.run_dir / "home"  # the RocketMQ C++ client logs under $HOME/logs
        home.mkdir(parents=True, exist_ok=True)
        return world.child_env({
            "HOME": str(home), "CKIT_DB_URL": self.urls.orders,
            "CKIT_TRANSPORT": self.urls.transport, "FAULTS_ORDERS_URL": self.urls.orders,
            "FAULTS_INVENTORY_URL": self.urls.inventory, "FAULTS_REDIS_URL": self.urls.redis,
            "FAULTS_TRANSPORT": self.urls.transport,
            "FAULTS_REDIS_CLAIMS": self.cfg.redis_claims, **(extra or {})})

    def add_processes(self) -> None:
        logs = self.cfg.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = self.env()
        cli = [*kit.CLI, "-v"]  # INFO: busy and reconsumed messages, queue hand-overs, shutdowns
        roles: list[tuple[str, int, list[str]]] = [
            ("consume", 1, [*cli, "consume", "bench.faults.app:app"]),
            ("consume", 2, [*cli, "consume", "bench.faults.app:app"]),
            ("receipts", 1, [*cli, kit.RECEIPTS_COMMAND, "--producer", world.PRODUCER]),
            ("relay", 1, [*cli, "relay", "--claim", self.cfg.relay_claim]),
            ("relay", 2, [*cli, "relay", "--claim", self.cfg.relay_claim]),
            ("producer", 1, [sys.executable, "-m", "bench.faults.producer",
                             "--orders", str(self.cfg.messages), "--rate", f"{self.cfg.rate:.3f}"]),
        ]
        for kind, index, argv in roles:
            self.supervisor.add(Proc(kind, index, argv, env, logs / f"{kind}-{index}.log",
                                     cwd=ROOT, done_on_success=kind == "producer"))

    def placed(self, engine: sa.engine.Engine) -> int:
        """The highest order id committed (orders are placed in id order), 0 when unknown."""
        try:
            with engine.connect() as conn:
                return int(conn.execute(sa.select(sa.func.max(world.orders.c.id))).scalar() or 0)
        except sa.exc.DBAPIError:
            return 0

    def inject_faults(self, injector: Injector, plan: list[schedule.Fault]) -> None:
        """Each fault at its planned time, and not before the producer is as far through the
        orders as the plan is through the window: when the producer runs slower than asked,
        the faults still fall all along the flow."""
        engine = world.engine(self.urls.orders)
        try:
            for fault in plan:
                due = int(fault.at / self.cfg.window * self.cfg.messages)
                while self.clock() < self.deadline and (
                        self.clock() < fault.at or self.placed(engine) < due):
                    time.sleep(min(0.5, max(0.01, fault.at - self.clock())))
                if self.clock() >= self.deadline:
                    self.errors.append(f"deadline reached before fault {fault.kind} "
                                       f"planned at {fault.at}s")
                    return
                if not self._inject(injector, fault):
                    return
        finally:
            engine.dispose()

    def _inject(self, injector: Injector, fault: schedule.Fault) -> bool:
        try:
            rec = injector.apply(fault)
        except (ServiceError, InjectError, OSError, subprocess.SubprocessError) as exc:
            self.errors.append(f"fault {fault.kind} could not be carried out: {exc}")
            self.say(f"ERROR: {self.errors[-1]}")
            return False
        self.records.append(rec)
        self.say(rec.line())
        return True

    def wait_producer(self) -> None:
        producer = self.supervisor.procs["producer-1"]
        while not producer.finished and self.clock() < self.deadline:
            time.sleep(0.5)
        if not producer.finished:
            self.errors.append("the producer did not finish before the deadline")


def run(cfg: Config, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Carry out one run; returns the report dict (`report["ok"]` says whether it passed)."""
    if cfg.run_dir.exists() and any(cfg.run_dir.iterdir()):
        raise ServiceError(f"run folder {cfg.run_dir} is not empty: give another --dir")
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    r = Run(cfg, out)
    sampler: timeline.Sampler | None = None
    settled: settle.Settled | None = None
    final: checks.Snapshot | None = None
    shutdown: dict[str, float | None] = {}
    injector: Injector | None = None
    flow_end = 0.0
    effects: list[tuple[int, int, float]] = []
    placed: dict[int, float] = {}
    try:
        r.start_services()
        r.add_processes()
        r.flow0 = time.time()
        r.supervisor.start_all()
        r.say(f"started {len(r.supervisor.procs)} processes; producer at {cfg.rate:.1f} orders/s")
        sampler = timeline.Sampler(r.urls.orders, r.clock)
        sampler.start()
        kinds = schedule.kinds_for(cfg.transport, cfg.db)
        plan = schedule.plan(kinds, repeats=cfg.repeats, start=min(10.0, cfg.window * 0.1),
                             end=cfg.window * 0.92, seed=cfg.seed)
        injector = Injector(supervisor=r.supervisor, database=r.database, redis=r.redis,
                            rocketmq=r.rocketmq, orders_url=r.urls.orders, clock=r.clock,
                            seed=cfg.seed, cli_env=r.env())
        r.inject_faults(injector, plan)
        r.wait_producer()
        flow_end = r.clock()
        r.say(f"faults over and every order placed; draining (quiet {cfg.quiet:g}s)")
        orders, inventory = world.engine(r.urls.orders), world.engine(r.urls.inventory)
        try:
            settled = settle.settle(
                orders=orders, inventory=inventory, expected=cfg.messages, clock=r.clock,
                deadline=r.deadline, quiet=cfg.quiet, stuck_after=cfg.stuck_after,
                env=r.env(), inventory_url=r.urls.inventory,
                out_dir=cfg.run_dir / "reconcile", stormed=injector.stormed, say=r.say)
            final = checks.snapshot(orders, inventory)
            try:
                r.dead_letters = checks.dead_letters(r.urls.transport)
            except Exception as exc:  # a diagnostic: report it, do not fail the run on it
                r.dead_letters = {"error": kit.mask(f"{type(exc).__name__}: {exc}")}
            effects = report.effect_rows(inventory)
            placed = report.placed_times(orders)
        finally:
            orders.dispose()
            inventory.dispose()
    except (ServiceError, OSError, RuntimeError, sa.exc.SQLAlchemyError) as exc:
        r.errors.append(f"{type(exc).__name__}: {kit.mask(str(exc))}")
        r.say(f"ERROR: {r.errors[-1]}")
    finally:
        if sampler is not None:
            sampler.stop()
        if r.supervisor.procs:
            r.stopped_at = r.clock()
            shutdown = r.supervisor.stop_all()
        try:  # the latest deadlock, for the report's reader (PostgreSQL logs every one)
            if isinstance(r.database, MariaDB):
                (cfg.run_dir / "innodb-status.txt").write_text(r.database.innodb_status())
        except Exception as exc:  # a diagnostic must not fail the run
            r.say(f"could not read SHOW ENGINE INNODB STATUS: {exc}")
        if not cfg.keep_services:
            for service in (r.rocketmq, r.redis, r.database):
                if service is not None:
                    try:
                        service.stop()
                    except (ServiceError, OSError) as exc:
                        r.errors.append(f"stopping {service.name}: {exc}")
    result = report.build(
        cfg=cfg, run=r, settled=settled, final=final, effects=effects, placed=placed,
        shutdown=shutdown,
        samples=sampler.samples if sampler else [], flow_end=flow_end,
        stormed=len(injector.stormed) if injector else 0)
    if cfg.timeline is not None and r.flow0 is not None:
        timeline.render(cfg.timeline, title=report.title(cfg), t0=r.flow0,
                        effect_times=[e[2] for e in effects], end=r.clock(),
                        samples=sampler.samples if sampler else [],
                        faults=[rec.to_dict() for rec in r.records],
                        converged_at=settled.converged_at if settled else None)
        result["timeline_png"] = str(cfg.timeline)
    return result
