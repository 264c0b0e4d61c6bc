"""One relay process for several producer databases (seed 001: "split databases and tables").

A sharded service keeps one outbox per database. `MultiRelay` runs one `Relay` per database in
one process, each on its own thread(s) with its own engines, claims and back-off, sharing the
transport: a database that is down waits out its outage alone while the others keep sending.
Each database may have its own read replica (`read_urls`) and its own delayed checks
(`outbox_producer.checks`). One process per shard works as well (`ckit relay --url` once per
process); this is the same thing with fewer processes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.progress import mark_committed
from consumer_kit.core.urls import mask_url
from consumer_kit.transports.base import Transport
from outbox_producer.distinct import check_distinct_outboxes
from outbox_producer.relay import Relay, RelayResult


class MultiRelay:
    """A `Relay` per producer database, run side by side.

    >>> relays = MultiRelay(["mysql+pymysql://.../orders_0", "mysql+pymysql://.../orders_1"],
    ...                     transport, batch=500)                          # doctest: +SKIP
    >>> relays.run(once=True).stats.sent                                   # doctest: +SKIP
    """

    def __init__(self, urls: Sequence[str], transport: Transport, *,
                 read_urls: Sequence[str] = (), **relay_options: Any) -> None:
        if not urls:
            raise ConfigError("give at least one producer database (--url)")
        if len(set(urls)) != len(urls):
            raise ConfigError("a producer database is named twice (--url)")
        if read_urls and len(read_urls) != len(urls):
            raise ConfigError(f"give one --read-url per --url ({len(urls)}), or none; got "
                              f"{len(read_urls)}")
        self.urls = list(urls)
        self.relays = [Relay(url, transport, read_engine=read_urls[i] if read_urls else None,
                             **relay_options) for i, url in enumerate(urls)]
        self.results: list[RelayResult] = [RelayResult() for _ in self.relays]
        self.checked = len(self.relays) == 1

    def check(self) -> None:
        """Refuse databases that hold one outbox (one named twice in two spellings, or a copy
        of a shard given as another: every row would be sent twice;
        `distinct.check_distinct_outboxes`). A database that does not answer is left out with
        a warning: its relay waits out the outage while the others send. `run` checks once,
        unless this was called before it.

        Raises:
            ConfigError: two of them hold one outbox (before any row moves)."""
        if not self.checked:
            check_distinct_outboxes([relay.engine for relay in self.relays],
                                    self.relays[0].table, skip_unreachable=True)
            self.checked = True

    def stop(self) -> None:
        """Ask every relay to finish its batch and return (safe from a signal handler, as
        `Relay.stop` is)."""
        for relay in self.relays:
            relay.stop()

    def run(self, *, once: bool = False) -> RelayResult:
        """Run every relay until `stop()` (with `once`, until each has drained what is due);
        return the totals (`results` holds each database's, in the order of `urls`).

        Raises:
            ConfigError: two databases hold one outbox (`check`, before any row moves)."""
        self.check()
        if len(self.relays) == 1:
            self.results[0] = self.relays[0].run(once=once)
            return self.results[0]

        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                self.results[i] = self.relays[i].run(once=once)
            except BaseException as exc:  # re-raised below, after the others stopped
                errors.append(exc)
                self.stop()

        threads = [threading.Thread(target=work, args=(i,), name=f"ckit-relay-db{i}")
                   for i in range(len(self.relays))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            # what every database's batches committed before the first error stopped them
            done = RelayResult.total([RelayResult.total(r.progress) for r in self.relays])
            committed = done.committed()
            if committed:
                mark_committed(errors[0], committed)
            raise errors[0]
        return RelayResult.total(self.results)

    def names(self) -> list[str]:
        """The databases, passwords masked, in the order of `urls`."""
        return [mask_url(url) for url in self.urls]
