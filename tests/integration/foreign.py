"""Helpers for tests with messages that consumer-kit did not send, consumed by `ckit consume`.

- `RawProducer`: the plain rocketmq-client-python 2.0.0 `Producer`, no envelope (as a service
  that does not use consumer-kit sends: body, tags, optional KEYS, its own properties);
- `mqadmin_send`: the broker's own tool (`scripts/rocketmq.sh admin sendMessage`, a Java
  `DefaultMQProducer`);
- `CkitConsume`: `ckit consume tests.integration.poison_app:app` as a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from consumer_kit.transports import ConsumeStatus, Delivery
from consumer_kit.transports.rocketmq import native

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class RawProducer:
    """rocketmq-client-python 2.0.0 used the way its README shows, without consumer-kit."""

    def __init__(self, addr: str) -> None:
        client = native.client()
        self._client = client
        self._producer = client.Producer(f"foreign-{uuid.uuid4().hex[:8]}")
        self._producer.set_name_server_address(addr)
        # a distinct instance name: the test process may run other producers of its own
        native.set_producer_instance_name(self._producer, native.new_instance_name("foreign"))
        self._producer.start()

    def send(self, topic: str, body: dict[str, Any], *, keys: str | None = None,
             tags: str | None = None, properties: dict[str, str] | None = None) -> str:
        """Send one message; return its broker message id (the UNIQ_KEY)."""
        msg = self._client.Message(topic)
        try:
            if keys:
                msg.set_keys(keys)
            if tags:
                msg.set_tags(tags)
            for name, value in (properties or {}).items():
                msg.set_property(name, value)
            msg.set_body(json.dumps(body))
            return str(self._producer.send_sync(msg).msg_id)
        finally:
            native.destroy_message(msg)

    def close(self) -> None:
        self._producer.shutdown()

    def __enter__(self) -> RawProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_MSG_ID = re.compile(r"SEND_OK\s+([0-9A-F]{32})")


def mqadmin_send(topic: str, body: dict[str, Any], *, keys: str | None = None,
                 tags: str | None = None) -> str:
    """Send with the broker's own `mqadmin sendMessage`; return the message id it prints."""
    args = ["bash", str(ROOT / "scripts" / "rocketmq.sh"), "admin", "sendMessage",
            "-t", topic, "-p", json.dumps(body)]
    if keys:
        args += ["-k", keys]
    if tags:
        args += ["-c", tags]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=ADMIN_TIMEOUT,
                          check=False)
    found = _MSG_ID.search(proc.stdout)
    if proc.returncode != 0 or not found:
        causes = [line for line in (proc.stdout + proc.stderr).splitlines() if "Exception" in line]
        raise AssertionError(f"mqadmin sendMessage failed: {causes[:3] or proc.stdout[-500:]}")
    return found.group(1)


class CkitConsume:
    """`ckit consume tests.integration.poison_app:app` in a subprocess (a real `ckit` run)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *, max_seconds: float,
                 app: str = "tests.integration.poison_app:app") -> None:
        self.log_path = tmp_path / f"ckit-consume-{uuid.uuid4().hex[:6]}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumer_kit.cli.main", "consume", app,
             "--max-seconds", str(max_seconds)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **env, "HOME": str(tmp_path),
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))},
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> str:
        """SIGTERM, wait (bounded), SIGKILL if needed; return everything it printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        self._log.close()
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> CkitConsume:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class Collected:
    """A consume callback that keeps what it gets and acks it; `arrived` is set at the first."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.arrived = threading.Event()

    def __call__(self, delivery: Delivery) -> ConsumeStatus:
        self.deliveries.append(delivery)
        self.arrived.set()
        return ConsumeStatus.CONSUME_SUCCESS
