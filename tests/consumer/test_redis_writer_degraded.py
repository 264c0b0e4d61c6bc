"""The writer thread while the store is degraded (finish and release are queued to it then):
it waits out the degraded window as the claims do, instead of trying Redis at every batch. Before,
a consumer whose Redis was down tried a new connection about 60 times a second (one per
`linger` of queued done markers), each failure extending the window, where the claims try once
per `retry_after`; and what it could not send piled up to `max_queued`."""

from __future__ import annotations

import socket
import time

import redis

from consumer_kit.dedupe import RedisDedupe
from consumer_kit.dedupe.packer import client_options


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_writer_tries_a_down_redis_once_per_window_not_at_every_batch() -> None:
    # Given a store whose Redis is down (nothing listens on its port), degraded for 5 s
    client = redis.Redis.from_url(f"redis://127.0.0.1:{_dead_port()}/0", socket_timeout=0.5,
                                  socket_connect_timeout=0.5, **client_options())
    store = RedisDedupe(client, "writer-down")
    try:
        store.degrade("claim", redis.ConnectionError("Connection refused."))
        before = store.failures

        # When messages go on being processed by the database path for a second (each queues
        # its done marker or its lease release for the writer)
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < 1.0:
            store.finish(f"M{n}", "me")
            if n % 3 == 0:
                store.release(f"R{n}", "me")
            n += 1
            time.sleep(0.002)
        time.sleep(0.1)

        # Then the writer has not tried Redis in that window (the claims do not either)
        assert store.failures - before == 0
        assert store.degraded
    finally:
        store.writer._stop.set()
        store.writer._queued.set()
        client.close()


def test_a_failed_batch_of_the_writer_drops_what_is_queued_with_it() -> None:
    # Given a store whose Redis is down, with markers queued (a window just ended)
    client = redis.Redis.from_url(f"redis://127.0.0.1:{_dead_port()}/0", socket_timeout=0.5,
                                  socket_connect_timeout=0.5, **client_options())
    store = RedisDedupe(client, "writer-drop", retry_after=60)
    try:
        for n in range(1000):
            store.finish(f"M{n}", "me")

        # When the writer's batch fails
        store.writer._send(store.writer._batch())

        # Then the rest would fail too: dropped (harmlessly, as the batch's are), not kept to
        # pile up for the whole outage
        assert not store.writer._calls and not store.writer._unridden
        assert store.degraded
    finally:
        store.writer._stop.set()
        store.writer._queued.set()
        client.close()
