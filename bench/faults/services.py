"""The fault run's own services: a Redis and (for RocketMQ) a name server + broker, or (for
RocketMQ 5) a name server + proxy with its broker inside; what they share with its database
server (`mariadb`, or with `--db postgresql` `postgres`): ports, waits, one started daemon.

Other engineers use the shared services of scripts/setup.sh at the same time, so the runner never
touches those: it starts its own instances on loopback ports of their own, with their data in the
run folder, and kills or restarts only processes whose PIDs it started. Redis runs from the
Debian package that setup.sh installs (`redis-server`; MariaDB likewise, in `mariadb`); RocketMQ
runs through `scripts/rocketmq.sh` (RocketMQ 5 through
`scripts/rocketmq5.sh`) with its run folder and ports given by environment (the jars and the
loopback bind shim come from the cache setup.sh filled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


class ServiceError(RuntimeError):
    """A service did not start or stop in time (the message says where its log is)."""


@dataclasses.dataclass(frozen=True)
class Ports:
    """The run's loopback ports: the shared services' ports plus `offset`."""

    offset: int = 10_000

    @property
    def mariadb(self) -> int:
        return 3306 + self.offset

    @property
    def postgresql(self) -> int:
        """The run's PostgreSQL (`--db postgresql`; scripts/postgres.sh: 5432)."""
        return 5432 + self.offset

    @property
    def redis(self) -> int:
        return 6379 + self.offset

    @property
    def namesrv(self) -> int:
        return 9876 + self.offset

    @property
    def broker(self) -> int:
        return 10911 + self.offset

    @property
    def namesrv5(self) -> int:
        """RocketMQ 5's name server (scripts/rocketmq5.sh: 9886)."""
        return 9886 + self.offset

    @property
    def broker5(self) -> int:
        """RocketMQ 5's broker inside the proxy (10951)."""
        return 10951 + self.offset

    @property
    def proxy(self) -> int:
        """RocketMQ 5's proxy, gRPC (8081); its remoting port is the next one (8082)."""
        return 8081 + self.offset

    def all(self, transport: str, db: str = "mariadb") -> list[int]:
        """Every port the run listens on for `transport` and `db` (a broker also takes PORT-2
        and PORT+1)."""
        extra = {
            "rocketmq": [self.namesrv, self.broker - 2, self.broker, self.broker + 1],
            "rocketmq5": [self.namesrv5, self.broker5 - 2, self.broker5, self.broker5 + 1,
                          self.proxy, self.proxy + 1],
        }.get(transport, [])
        database = self.postgresql if db == "postgresql" else self.mariadb
        return [database, self.redis, *extra]


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def check_ports_free(ports: list[int]) -> None:
    """Raise ServiceError naming the first port already in use."""
    for port in ports:
        if port_open(port):
            raise ServiceError(f"port {port} is in use on 127.0.0.1: pick other ports with "
                               "--port-offset")


def wait_until(what: str, check: Callable[[], bool], timeout: float,
               interval: float = 0.2) -> None:
    """Poll `check()` until true or raise ServiceError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise ServiceError(f"timed out after {timeout:g}s waiting for {what}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


class _Daemon:
    """One server process started here (its own session, output to a log file)."""

    name = "daemon"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log = folder / "launch.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def _spawn(self, argv: list[str]) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True)

    def _exited(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.name} exited with {self.proc.returncode}"
        return None

    def kill9(self) -> int:
        """SIGKILL the server started here; returns its pid."""
        if self.proc is None or self.proc.poll() is not None:
            raise ServiceError(f"{self.name} is not running")
        pid = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT)
        return pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)


class Redis(_Daemon):
    """`redis-server` on 127.0.0.1:`port`, no persistence (a restart starts empty)."""

    name = "redis"

    def __init__(self, folder: Path, port: int) -> None:
        super().__init__(folder)
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2,
                           socket_connect_timeout=2)

    def start(self) -> None:
        """Start the server and wait (bounded) for a PONG."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._spawn([program("redis-server"), "--bind", "127.0.0.1", "--port", str(self.port),
                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                     "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")])

        def up() -> bool:
            if (why := self._exited()) is not None:
                raise ServiceError(f"{why}: {_tail(self.folder / 'redis.log')}")
            try:
                with contextlib.closing(self.client()) as c:
                    return bool(c.ping())
            except redis.RedisError:
                return False

        wait_until(f"Redis on port {self.port}", up, START_TIMEOUT)

    def flushall(self) -> None:
        with contextlib.closing(self.client()) as c:
            c.flushall()

    def version(self) -> str:
        with contextlib.closing(self.client()) as c:
            return str(c.info("server")["redis_version"])


class RocketMQ:
    """A name server + broker of its own through scripts/rocketmq.sh (run folder and ports by
    environment). Its JVMs are started by that script on the runner's behalf; their pids are in
    the run folder's pid files, and only those are ever killed."""

    name = "rocketmq"
    SCRIPT = "rocketmq.sh"
    COMPONENTS = ("namesrv", "broker")
    #: seconds the script may take to start (and register) what is down
    START_SECONDS = START_TIMEOUT + 30

    def __init__(self, folder: Path, namesrv_port: int, broker_port: int) -> None:
        self.folder = folder
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port
        self.log = folder / "script.log"
        self.addr = f"127.0.0.1:{namesrv_port}"

    def _env(self, timeout: float) -> dict[str, str]:
        """The script's settings: this run folder, these ports."""
        return {"CKIT_ROCKETMQ_RUN": str(self.folder),
                "CKIT_ROCKETMQ_NAMESRV_PORT": str(self.namesrv_port),
                "CKIT_ROCKETMQ_BROKER_PORT": str(self.broker_port),
                "CKIT_ROCKETMQ_TIMEOUT": str(int(timeout))}

    def _script(self, *args: str, timeout: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self._env(timeout)}
        with self.log.open("ab") as out:
            rc = subprocess.run(["bash", str(SCRIPTS / self.SCRIPT), *args], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                timeout=timeout + 30, check=False).returncode
        if rc != 0:
            raise ServiceError(f"scripts/{self.SCRIPT} {' '.join(args)} failed ({rc}): "
                               f"{_tail(self.log)}")

    def start(self) -> None:
        """Start whatever of the two is not running and wait until the broker is registered."""
        self._script("start", timeout=self.START_SECONDS)

    def stop(self) -> None:
        self._script("stop", timeout=STOP_TIMEOUT)

    def pid(self, component: str) -> int | None:
        """The pid of `component` when its pid file names a live JVM of this run folder."""
        try:
            pid = int((self.folder / f"{component}.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError):
            return None
        ours = b"org.apache.rocketmq" in cmdline and str(self.folder).encode() in cmdline
        return pid if ours else None

    def kill9(self, component: str) -> int:
        """SIGKILL one of `COMPONENTS` of this run; returns its pid."""
        pid = self.pid(component)
        if pid is None:
            raise ServiceError(f"{component} of {self.folder} is not running")
        os.kill(pid, signal.SIGKILL)

        def gone() -> bool:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return True
            return state in ("Z", "X")

        wait_until(f"{component} pid {pid} to die", gone, STOP_TIMEOUT)
        # A JVM's main thread is a zombie while its other threads still exit and hold its
        # sockets: a restart right away would find the port taken
        port = self.port_of(component)
        wait_until(f"{component} port {port} to close", lambda: not port_open(port),
                   STOP_TIMEOUT)
        return pid

    def port_of(self, component: str) -> int:
        """The port `component` listens on."""
        return self.namesrv_port if component == "namesrv" else self.broker_port


class RocketMQ5(RocketMQ):
    """A RocketMQ 5 name server + proxy (local mode: the broker runs inside the proxy's JVM)
    of its own through scripts/rocketmq5.sh, run folder and ports by environment, as
    `RocketMQ`. Killing the proxy kills its broker too; `start` brings back whichever of the
    two is down and waits until the broker is registered and the proxy answers."""

    name = "rocketmq5"
    SCRIPT = "rocketmq5.sh"
    COMPONENTS = ("namesrv", "proxy")
    #: the proxy's JVM (1 GiB heap, the broker inside) took 74 s to start on 2 busy cores,
    #: then the script creates its standing topics: its own default, 150 s
    START_SECONDS = 150.0

    def __init__(self, folder: Path, namesrv_port: int, broker_port: int,
                 proxy_port: int) -> None:
        super().__init__(folder, namesrv_port, broker_port)
        self.proxy_port = proxy_port
        self.proxy_addr = f"127.0.0.1:{proxy_port}"

    def port_of(self, component: str) -> int:
        return self.namesrv_port if component == "namesrv" else self.proxy_port

    def _env(self, timeout: float) -> dict[str, str]:
        return {"CKIT_ROCKETMQ5_RUN": str(self.folder),
                "CKIT_ROCKETMQ5_NAMESRV_PORT": str(self.namesrv_port),
                "CKIT_ROCKETMQ5_BROKER_PORT": str(self.broker_port),
                "CKIT_ROCKETMQ5_PROXY_PORT": str(self.proxy_port),
                "CKIT_ROCKETMQ5_PROXY_REMOTING_PORT": str(self.proxy_port + 1),
                "CKIT_ROCKETMQ5_TIMEOUT": str(int(timeout))}


def program(name: str) -> str:
    """The path of a server program (root's PATH has /usr/sbin, a user's may not)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


def missing_programs(transport: str, db: str = "mariadb") -> list[str]:
    """The programs on PATH a run on `transport` and `db` needs that this machine lacks
    (scripts/setup.sh installs them): both RocketMQ transports need java. PostgreSQL's are
    not on PATH: `postgres.missing_programs` looks for them."""
    java = transport in ("rocketmq", "rocketmq5")
    mariadb = ["mariadbd", "mariadb-install-db"] if db == "mariadb" else []
    needed = [*mariadb, "redis-server"] + (["java"] if java else [])
    return [name for name in needed if program(name) == name]
