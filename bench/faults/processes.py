"""The system under test as separate OS processes, supervised.

A `Proc` is one role (`producer-1`, `relay-2`, `consume-1`, `receipts-1`, ...) that the runner keeps
running: its output goes to `logs/NAME.log` (appended across restarts), and each start is an
incarnation with its own pid. The `Supervisor` restarts a role that exits by itself (recorded as
an unplanned exit, with the log's last lines) after a short back-off, except the producer, which
ends by itself with exit 0 once every order is placed. Faults kill roles through `kill9` (not
counted as unplanned) and start them again with `start`. `stop_all` sends SIGTERM to everything
at once and records how long each role took to exit; one still running after the grace period is
killed and recorded as a shutdown hang.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

WATCH_INTERVAL = 0.5
RESTART_BACKOFF = (1.0, 2.0, 4.0, 8.0)
SHUTDOWN_GRACE = 20.0
HANG_AFTER = 10.0


@dataclasses.dataclass
class Incarnation:
    """One start of a role: its pid, when it started and how it ended."""

    pid: int
    started: float
    ended: float | None = None
    how: str | None = None  # "killed" (a fault), "exit N" (by itself), "stopped", "hung"


@dataclasses.dataclass
class Proc:
    """One supervised role."""

    kind: str
    index: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    cwd: Path
    done_on_success: bool = False  # the producer: exit 0 means finished, not crashed
    popen: subprocess.Popen[bytes] | None = None
    incarnations: list[Incarnation] = dataclasses.field(default_factory=list)
    finished: bool = False
    crashes_in_row: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None and self.popen.poll() is None else None

    def spawn(self, now: float) -> int:
        with self.log_path.open("ab") as out:
            out.write(f"\n==== {self.name} start at t={now:.1f}s ====\n".encode())
            out.flush()
            self.popen = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                          start_new_session=True)
        self.incarnations.append(Incarnation(self.popen.pid, now))
        return self.popen.pid

    def last_lines(self, n: int = 6) -> list[str]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line[:300] for line in lines[-n:]]


@dataclasses.dataclass
class UnplannedExit:
    """A role that exited by itself (not killed by a fault, not stopped at the end)."""

    t: float
    name: str
    pid: int
    code: int
    last_lines: list[str]


class Supervisor:
    """Starts the roles, restarts the ones that exit by themselves, stops them all at the end."""

    def __init__(self, clock: Callable[[], float], say: Callable[[str], None]) -> None:
        self.clock = clock
        self.say = say
        self.procs: dict[str, Proc] = {}
        self.unplanned: list[UnplannedExit] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="faults-supervisor", daemon=True)
        self._restart_at: dict[str, float] = {}

    def add(self, proc: Proc) -> Proc:
        self.procs[proc.name] = proc
        return proc

    def of_kind(self, kind: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.kind == kind]

    def start(self, name: str) -> int:
        """Start (or restart) role `name`; returns the new pid."""
        with self._lock:
            proc = self.procs[name]
            self._restart_at.pop(name, None)
            return proc.spawn(self.clock())

    def start_all(self) -> None:
        for name in self.procs:
            self.start(name)
        self._thread.start()

    def kill9(self, name: str) -> int | None:
        """SIGKILL role `name` (a fault); returns the pid, or None when it was not running."""
        with self._lock:
            proc = self.procs[name]
            if proc.popen is None or proc.popen.poll() is not None:
                return None
            pid = proc.popen.pid
            proc.popen.send_signal(signal.SIGKILL)
            proc.popen.wait(30)
            self._close(proc, "killed")
            return pid

    def _close(self, proc: Proc, how: str) -> None:
        if proc.incarnations and proc.incarnations[-1].ended is None:
            proc.incarnations[-1].ended = self.clock()
            proc.incarnations[-1].how = how

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            with self._lock:
                for proc in self.procs.values():
                    self._check(proc)

    def _check(self, proc: Proc) -> None:
        now = self.clock()
        if proc.finished:
            return
        if proc.name in self._restart_at:
            if now >= self._restart_at[proc.name]:
                self.say(f"restart {proc.name} after its unplanned exit")
                self.start(proc.name)
            return
        if proc.popen is None or proc.popen.poll() is None:
            if proc.popen is not None and proc.incarnations and \
                    now - proc.incarnations[-1].started > 30:
                proc.crashes_in_row = 0
            return
        code = proc.popen.returncode
        if proc.incarnations[-1].ended is not None:  # killed by a fault, not restarted yet
            return
        self._close(proc, f"exit {code}")
        if code == 0 and proc.done_on_success:
            proc.finished = True
            self.say(f"{proc.name} finished")
            return
        self.unplanned.append(UnplannedExit(now, proc.name, proc.popen.pid, code,
                                            proc.last_lines()))
        delay = RESTART_BACKOFF[min(proc.crashes_in_row, len(RESTART_BACKOFF) - 1)]
        proc.crashes_in_row += 1
        self.say(f"UNPLANNED exit of {proc.name} (pid {proc.popen.pid}, code {code}); "
                 f"restart in {delay:g}s")
        self._restart_at[proc.name] = now + delay

    def running(self, name: str) -> bool:
        return self.procs[name].pid is not None

    def stop_all(self, grace: float = SHUTDOWN_GRACE) -> dict[str, float | None]:
        """SIGTERM every running role at once; wait up to `grace` seconds. Returns each role's
        seconds to exit (None: it was not running); a role still up is killed and marked hung."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        began = time.monotonic()
        took: dict[str, float | None] = {}
        with self._lock:
            alive = {n: p for n, p in self.procs.items() if p.pid is not None}
            for name in self.procs:
                took[name] = None
            for proc in alive.values():
                assert proc.popen is not None
                proc.popen.send_signal(signal.SIGTERM)
            pending = dict(alive)
            while pending and time.monotonic() - began < grace:
                for name, proc in list(pending.items()):
                    assert proc.popen is not None
                    if proc.popen.poll() is not None:
                        took[name] = round(time.monotonic() - began, 2)
                        self._close(proc, "stopped")
                        del pending[name]
                time.sleep(0.1)
            for name, proc in pending.items():
                assert proc.popen is not None
                proc.popen.kill()
                proc.popen.wait(30)
                took[name] = round(time.monotonic() - began, 2)
                self._close(proc, "hung")
        return took
