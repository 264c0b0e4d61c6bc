"""The fault run's own MariaDB (the default `--db`): `mariadb-install-db` + `mariadbd
--no-defaults` from the Debian packages scripts/setup.sh installs, on the run's own port with its
data in the run folder; only the PID started here is ever killed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pymysql

from bench.faults.services import (
    START_TIMEOUT,
    ServiceError,
    _Daemon,
    _tail,
    port_open,
    program,
    wait_until,
)


class MariaDB(_Daemon):
    """`mariadbd --no-defaults` on 127.0.0.1:`port` with a data directory of its own."""

    name = "mariadb"

    def __init__(self, folder: Path, port: int) -> None:
        super().__init__(folder)
        self.port = port
        self.datadir = folder / "data"
        self.socket = folder / "mysqld.sock"
        self.error_log = folder / "error.log"

    def install(self) -> None:
        """A fresh data directory (root with no password, reachable on the socket only)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.datadir / "mysql").is_dir():
            return
        argv = [program("mariadb-install-db"), "--no-defaults", f"--datadir={self.datadir}",
                "--auth-root-authentication-method=normal", "--skip-test-db", *self._user()]
        with self.log.open("ab") as out:
            rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                timeout=START_TIMEOUT, check=False).returncode
        if rc != 0:
            raise ServiceError(f"mariadb-install-db failed ({rc}): {_tail(self.log)}")

    @staticmethod
    def _user() -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def start(self) -> None:
        """Start the server and wait (bounded) until it answers on its socket."""
        self._spawn([program("mariadbd"), "--no-defaults", f"--datadir={self.datadir}",
                     f"--port={self.port}", "--bind-address=127.0.0.1",
                     f"--socket={self.socket}", f"--pid-file={self.folder / 'mysqld.pid'}",
                     f"--log-error={self.error_log}", "--skip-name-resolve",
                     "--innodb-buffer-pool-size=256M", "--max-connections=500",
                     # every deadlock (both statements) goes to the error log: the status
                     # keeps only the latest, and a kill -9 of the server loses even that
                     "--innodb-print-all-deadlocks=ON",
                     *self._user()])

        def up() -> bool:
            if (why := self._exited()) is not None:
                raise ServiceError(f"{why}: {_tail(self.error_log)}")
            try:
                self.root().close()
                return port_open(self.port)
            except pymysql.Error:
                return False

        wait_until(f"MariaDB on port {self.port} (log {self.error_log})", up, START_TIMEOUT)

    def root(self) -> pymysql.connections.Connection:
        """A root connection over the socket."""
        return pymysql.connect(unix_socket=str(self.socket), user="root", connect_timeout=2)

    def provision(self, databases: tuple[str, ...], user: str, password: str) -> None:
        """Create the databases and a user with every privilege on them, on 127.0.0.1."""
        conn = self.root()
        try:
            with conn.cursor() as cur:
                for db in databases:
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4")
                cur.execute("CREATE USER IF NOT EXISTS %s@'127.0.0.1' IDENTIFIED BY %s",
                            (user, password))
                for db in databases:
                    cur.execute(f"GRANT ALL PRIVILEGES ON `{db}`.* TO %s@'127.0.0.1'", (user,))
            conn.commit()
        finally:
            conn.close()

    def innodb_status(self) -> str:
        """`SHOW ENGINE INNODB STATUS` (its LATEST DETECTED DEADLOCK names both statements)."""
        conn = self.root()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW ENGINE INNODB STATUS")
                return str(cur.fetchone()[2])
        finally:
            conn.close()

    def version(self) -> str:
        conn = self.root()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                return str(cur.fetchone()[0])
        finally:
            conn.close()
