"""A consumer process for the SQL transport's multi-process tests (not a test module).

usage: python -m tests.transports.sql_mp_worker URL PREFIX GROUP TOPIC OUT_FILE
           [--lease S] [--hang-after N] [--work-ms MS] [--max-life S]

Appends one line per event to OUT_FILE with O_APPEND writes (nothing buffered, so a SIGKILL
loses nothing written): `ready <pid>`, `got <pid> <body> <reconsume>` before the work,
`done <pid> <body>` after it, `hang <pid> <body>` when it stops forever inside a callback.
Exits on SIGTERM (clean shutdown: commit, release, leave) or after `--max-life` seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

from consumer_kit.transports import ConsumeStatus, Delivery, Subscription
from consumer_kit.transports.sql import SqlTransport


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "prefix", "group", "topic", "out"):
        parser.add_argument(name)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--max-life", type=float, default=120.0)
    args = parser.parse_args()

    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.getpid()
    count = 0
    count_lock = threading.Lock()
    stop = threading.Event()

    def record(line: str) -> None:
        os.write(fd, f"{line}\n".encode())

    def callback(delivery: Delivery) -> ConsumeStatus:
        nonlocal count
        body = delivery.body.decode()
        record(f"got {pid} {body} {delivery.reconsume_times}")
        with count_lock:
            count += 1
            hang = args.hang_after and count == args.hang_after
        if hang:
            record(f"hang {pid} {body}")
            while True:  # mid-message until SIGKILL
                time.sleep(1)
        time.sleep(args.work_ms / 1000)
        record(f"done {pid} {body}")
        return ConsumeStatus.CONSUME_SUCCESS

    # stop set from a thread: the main thread's stop.wait() may hold the event's lock when
    # the handler runs (cli/runtime.on_shutdown)
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    transport = SqlTransport(args.url, table_prefix=args.prefix, lease_seconds=args.lease,
                             poll_interval=0.02, retry_delays=[0.1])
    consumer = transport.consumer(args.group, [Subscription(args.topic)], callback, threads=2)
    consumer.start()
    record(f"ready {pid}")
    stop.wait(args.max_life)
    consumer.shutdown(timeout=5)
    transport.close()
    record(f"exit {pid}")
    os.close(fd)


if __name__ == "__main__":
    main()
