"""The fault run's own PostgreSQL (`--db postgresql`), started like its MariaDB.

Debian's server binaries (scripts/postgres.sh installs them under /usr/lib/postgresql/<major>/bin;
they are not on PATH): `initdb` makes a data directory in the run folder, `postgres -D dir -p PORT
-k sockdir -c listen_addresses=127.0.0.1` runs it on the run's own port (the shared port 5432 +
the offset). PostgreSQL refuses to run as root: as root the folder is handed to the `postgres`
user and both programs run as that user (the child switches user itself before it execs, as
`runuser -u postgres --` would, so the PID the runner holds is the postmaster's own and a kill -9
hits the server, not a wrapper). Only that PID is ever signalled; after a kill -9 its backends
(found by their working directory, the run's data directory) exit by themselves, and a restart
waits for them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from bench.faults.services import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    ServiceError,
    _Daemon,
    _tail,
    port_open,
    wait_until,
)

PG_ROOT = Path("/usr/lib/postgresql")
#: the postgres user PostgreSQL runs as when the runner is root
RUN_AS = "postgres"
#: the shared service's port (scripts/postgres.sh); the run's is this + the offset
BASE_PORT = 5432


def bin_dir() -> Path | None:
    """The newest installed major's bin folder, None when no server is installed."""
    majors = sorted((p for p in PG_ROOT.glob("*") if (p / "bin" / "postgres").is_file()),
                    key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.split(".")])
    return majors[-1] / "bin" if majors else None


def missing_programs() -> list[str]:
    """What a `--db postgresql` run lacks on this machine (scripts/postgres.sh install)."""
    found = bin_dir()
    if found is None:
        return ["postgres", "initdb"]
    return [n for n in ("postgres", "initdb") if not (found / n).is_file()]


def _working_in(folder: Path) -> list[int]:
    """PIDs of the live processes whose working directory is `folder`: a postmaster and every
    process it forked work in its data directory (each child has a session of its own, and a
    killed postmaster's children are orphans, so neither parent nor session finds them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if state not in ("Z", "X") and cwd == folder:
            found.append(int(entry.name))
    return found


class PostgreSQL(_Daemon):
    """`postgres -D data -p PORT -k folder` on 127.0.0.1:`port` with a data directory of its
    own; the superuser connects over the Unix socket in the folder (trust), the application
    user over TCP with a password."""

    name = "postgresql"

    def __init__(self, folder: Path, port: int) -> None:
        super().__init__(folder)
        self.port = port
        self.datadir = folder / "data"
        self.sockdir = folder
        self.bin = bin_dir()

    def _program(self, name: str) -> str:
        if self.bin is None:
            raise ServiceError("no PostgreSQL server under /usr/lib/postgresql: run "
                               "scripts/postgres.sh install")
        return str(self.bin / name)

    @staticmethod
    def _as_user() -> dict[str, object]:
        """Popen arguments that run the child as `postgres` when the runner is root."""
        if os.geteuid() != 0:
            return {}
        pw = pwd.getpwnam(RUN_AS)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def install(self) -> None:
        """A fresh data directory: superuser `postgres` trusted on the socket, passwords
        (scram-sha-256) on TCP."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(RUN_AS)
            os.chown(self.folder, pw.pw_uid, pw.pw_gid)
        if (self.datadir / "PG_VERSION").is_file():
            return
        argv = [self._program("initdb"), "-D", str(self.datadir), "-U", "postgres",
                "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8",
                "--locale=C.UTF-8", "--no-instructions"]
        with self.log.open("ab") as out:
            rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                cwd=self.folder, timeout=START_TIMEOUT, check=False,
                                **self._as_user()).returncode  # type: ignore[call-overload]
        if rc != 0:
            raise ServiceError(f"initdb failed ({rc}): {_tail(self.log)}")

    def _spawn(self, argv: list[str]) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=self.folder,
                start_new_session=True, **self._as_user())

    def start(self) -> None:
        """Start the server (once the backends of a killed one are gone: they hold its shared
        memory, which a new postmaster refuses to share) and wait until it answers."""
        wait_until(f"the processes of a killed postmaster in {self.datadir} to exit",
                   lambda: not self.leftovers(), STOP_TIMEOUT)
        self._spawn([self._program("postgres"), "-D", str(self.datadir), "-p", str(self.port),
                     "-k", str(self.sockdir), "-c", "listen_addresses=127.0.0.1",
                     # as the run's MariaDB (--max-connections=500); durability left at the
                     # defaults (fsync, synchronous_commit on), as scripts/postgres.sh does
                     "-c", "max_connections=500", "-c", "shared_buffers=128MB",
                     "-c", "logging_collector=off",
                     "-c", "log_line_prefix=%m [%p] %q%u@%d ",
                     # every deadlock and long lock wait goes to the log, with both statements
                     "-c", "log_lock_waits=on"])

        def up() -> bool:
            if (why := self._exited()) is not None:
                raise ServiceError(f"{why}: {_tail(self.log)}")
            try:
                self.root().close()
                return port_open(self.port)
            except psycopg.Error:
                return False

        wait_until(f"PostgreSQL on port {self.port} (log {self.log})", up, START_TIMEOUT)

    def root(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection over the socket (autocommit)."""
        return psycopg.connect(host=str(self.sockdir), port=self.port, user="postgres",
                               dbname=dbname, connect_timeout=2, autocommit=True)

    def provision(self, databases: tuple[str, ...], user: str, password: str) -> None:
        """Create a login role owning the databases (idempotent), as scripts/postgres.sh."""
        with self.root() as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone()
            if not exists:
                conn.execute(f'CREATE ROLE "{user}" LOGIN')
            conn.execute(psycopg.sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(user), psycopg.sql.Literal(password)))
            for db in databases:
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                    (db,)).fetchone():
                    conn.execute(f"CREATE DATABASE \"{db}\" OWNER \"{user}\" ENCODING 'UTF8' "
                                 "TEMPLATE template0")

    def version(self) -> str:
        with self.root() as conn:
            row = conn.execute("SHOW server_version").fetchone()
            return str(row[0]) if row else "?"

    def leftovers(self) -> list[int]:
        """The processes still working in the data directory: a killed postmaster's backends
        exit by themselves once they notice, and hold its shared memory until then."""
        datadir = self.datadir.resolve()
        return [pid for pid in _working_in(datadir) if pid != self.pid]

    def stop(self) -> None:
        """Fast shutdown (SIGINT: SIGTERM would wait for every client to leave), SIGKILL after
        STOP_TIMEOUT; then no process of this data directory may be left (after a SIGKILL its
        backends are the orphans of a postmaster started here: they are killed too)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
