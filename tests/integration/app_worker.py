"""A consumer process for the kill tests: a ConsumerApp over the SQL transport whose handler
writes one effect row per message and marks (with a file) when it is inside a handler."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from consumer_kit import ConsumerApp, Message
from consumer_kit.transports.sql import SqlTransport

env = os.environ
effects = sa.Table(env["W_EFFECTS"], sa.MetaData(),
                   sa.Column("id", sa.Integer, primary_key=True),
                   sa.Column("n", sa.Integer, nullable=False),
                   sa.Column("pid", sa.Integer, nullable=False))
busy = Path(env["W_BUSY_DIR"]) / f"busy-{os.getpid()}"
transport = SqlTransport(env["W_MQ"], table_prefix=env["W_PREFIX"], poll_interval=0.01,
                         lease_seconds=float(env["W_LEASE"]))
app = ConsumerApp(group=env["W_GROUP"], db=env["W_DB"], redis=env.get("W_REDIS") or None,
                  transport=transport, receipts=None, processed_table=env["W_PROCESSED"], threads=1)


@app.listener(env["W_TOPIC"])
def handle(msg: Message, session: Any) -> None:
    session.execute(sa.insert(effects).values(n=msg.json()["n"], pid=os.getpid()))
    # inside the handler, business write not committed; written whole, then renamed, so the
    # test never reads it half written
    busy.with_suffix(".tmp").write_text(str(msg.json()["n"]))
    busy.with_suffix(".tmp").replace(busy)
    time.sleep(float(env["W_HANDLER_SECONDS"]))
    busy.unlink()


stop = threading.Event()
# stop set from a thread: the main thread's stop.wait() may hold the event's lock when
# the handler runs (cli/runtime.on_shutdown)
signal.signal(signal.SIGTERM,
              lambda *_: threading.Thread(target=stop.set, daemon=True).start())
app.run(stop=stop, max_seconds=float(env["W_MAX_SECONDS"]))
app.close()
