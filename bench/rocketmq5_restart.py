"""How long a `rocketmq5://` client takes to reach its proxy again after the proxy was killed
and restarted, with the capped gRPC reconnect back-off (`consumer_kit.transports.rocketmq5.client`)
and with gRPC's default (1 s, x1.6 per failed attempt, up to 120 s), in the same run.

    python bench/rocketmq5_restart.py                      # 2 rounds per mode, 20 s outages
    python bench/rocketmq5_restart.py --rounds 3 --outage 10

Runs a 5.x name server + proxy of its own (scripts/rocketmq5.sh on offset ports, a run folder
in a temporary directory; the standing one is not touched; stopped by its PID at the end). Per
round and mode: a fresh transport with a consumer (2 threads) receives one message, the proxy
is killed with SIGKILL, stays down `--outage` seconds (a slow restart, as on a busy machine),
is started again; then one send every 0.2 s until one goes through, and the time until the
consumer gets it. Times are from the moment the proxy's gRPC port accepts connections again.
Each round runs in a process of its own (the client keeps channels per endpoint for the whole
process, so a second transport in one process could reuse the first one's channels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

# Run as `python bench/rocketmq5_restart.py`, this file's folder comes first on sys.path, where
# bench/rocketmq.py would shadow the client's `rocketmq` package: drop it, put the project first.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench.common import machine_facts, table  # noqa: E402
from bench.faults.services import RocketMQ5, port_open  # noqa: E402
from consumer_kit.testing.harness import wait_for  # noqa: E402
from consumer_kit.transports import (  # noqa: E402
    ConsumeStatus,
    Delivery,
    OutgoingMessage,
    Subscription,
)
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport, client  # noqa: E402

#: offset of this bench's ports from the standing 5.x (9886, 10951, 8081)
OFFSET = 13_000
MODES = ("capped back-off", "gRPC default")
#: give up on a round after this long (a client that never comes back is a finding, not a hang)
ROUND_LIMIT = 180.0


def channel_module(mode: str) -> None:
    """Make the client's new channels use `mode`'s back-off (existing channels keep theirs)."""
    import grpc.aio
    from rocketmq.v5.client.connection import rpc_channel

    client.v5()  # installs the capped module
    rpc_channel.aio = (client.BackoffCappedAio(grpc.aio) if mode == MODES[0]
                       else grpc.aio)


def one_round(broker: RocketMQ5, mode: str, outage: float) -> dict[str, Any]:
    channel_module(mode)
    transport = RocketMQ5Transport(f"rocketmq5://{broker.proxy_addr}?namesrv={broker.addr}",
                                   retry_delays=(1.0,), invisible_seconds=5.0)
    topic, group = f"ckit_rst_{uuid.uuid4().hex[:8]}", f"g_rst_{uuid.uuid4().hex[:8]}"
    transport.ensure_topic(topic)
    got: dict[bytes, float] = {}

    def callback(delivery: Delivery) -> ConsumeStatus:
        got.setdefault(delivery.body, time.monotonic())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = transport.consumer(group, [Subscription(topic)], callback, threads=2)
    consumer.start()
    try:
        transport.send(OutgoingMessage(topic, b"before"))
        if not wait_for(lambda: b"before" in got, 60):
            raise SystemExit(f"{mode}: nothing received before the restart")
        broker.kill9("proxy")
        killed = time.monotonic()
        time.sleep(outage)
        starting = threading.Thread(target=broker.start, name="proxy-start", daemon=True)
        starting.start()
        if not wait_for(lambda: port_open(broker.proxy_port), ROUND_LIMIT, interval=0.05):
            raise SystemExit(f"{mode}: the proxy did not open its port in {ROUND_LIMIT:g} s")
        opened = time.monotonic()
        sent = None
        while sent is None and time.monotonic() - opened < ROUND_LIMIT:
            try:
                transport.send(OutgoingMessage(topic, b"after"))
                sent = time.monotonic()
            except Exception:  # refused or unavailable until the client reconnects
                time.sleep(0.2)
        delivered = got.get(b"after") if wait_for(lambda: b"after" in got, ROUND_LIMIT) else None
        starting.join(ROUND_LIMIT)
        return {"mode": mode, "port_after_kill": opened - killed,
                "send": None if sent is None else sent - opened,
                "delivered": None if delivered is None else delivered - opened}
    finally:
        consumer.shutdown()
        transport.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python bench/rocketmq5_restart.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="proxy restarts per mode (default 2)")
    p.add_argument("--outage", type=float, default=20.0,
                   help="seconds the proxy stays down before it is started again (default 20)")
    p.add_argument("--round", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.outage < 0:
        p.error("--rounds must be >= 1 and --outage >= 0")
    if args.round:  # a child: one round against the parent's 5.x
        mode, folder = args.round
        print(json.dumps(one_round(broker_in(Path(folder)), MODES[int(mode)], args.outage)))
        return
    print(machine_facts())
    folder = Path(tempfile.mkdtemp(prefix="ckit-rmq5-restart-"))
    broker = broker_in(folder)
    broker.start()
    rows: list[dict[str, Any]] = []
    try:
        for n in range(args.rounds):
            for mode in (0, 1) if n % 2 == 0 else (1, 0):  # interleaved
                child = subprocess.run(
                    [sys.executable, __file__, "--outage", str(args.outage),
                     "--round", str(mode), str(folder)],
                    capture_output=True, text=True, timeout=4 * ROUND_LIMIT, check=False)
                if child.returncode != 0:
                    raise SystemExit(f"round {n + 1} ({MODES[mode]}) failed: "
                                     f"{child.stderr.strip().splitlines()[-1:]}")
                row = json.loads(child.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"round {n + 1} {row['mode']}: port open {row['port_after_kill']:.1f} s "
                      f"after the kill; first send {fmt(row['send'])} and delivery "
                      f"{fmt(row['delivered'])} after it", flush=True)
    finally:
        broker.stop()
    print()
    print(f"{args.rounds} proxy kill(s) per mode, proxy down {args.outage:g} s before its "
          "restart; seconds after its gRPC port opened again")
    lines = []
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        lines.append([mode, summary([r["send"] for r in mine]),
                      summary([r["delivered"] for r in mine])])
    print(table(["client channels", "first send (median, range)",
                 "first delivery (median, range)"], lines))


def broker_in(folder: Path) -> RocketMQ5:
    """This bench's 5.x (its state is the run folder's pid files, so a child can kill and
    restart the parent's proxy)."""
    return RocketMQ5(folder / "rmq5", 9886 + OFFSET, 10951 + OFFSET, 8081 + OFFSET)


def fmt(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def summary(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    if len(done) < len(values):
        return f"{len(values) - len(done)} of {len(values)} never"
    return f"{statistics.median(done):.1f} ({min(done):.1f}-{max(done):.1f})"


if __name__ == "__main__":
    main()
