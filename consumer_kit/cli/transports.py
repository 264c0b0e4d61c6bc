"""Opening the transport of a command that talks to other processes."""

from __future__ import annotations

from consumer_kit.core.errors import ConfigError
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import Transport


def open_for_processes(url: str, *, command: str, outage_limit: float | None = None
                       ) -> Transport:
    """Open `url` for a command whose messages go to or come from other processes;
    `outage_limit` bounds how long the SQL transport waits out its database (a `--once` run's
    `--give-up-after`; other transports bound their waits themselves).

    Raises:
        ConfigError: the transport reaches only its own process (memory://): a relay would mark
            rows SENT into nowhere, a consumer would wait forever.
    """
    options = ({"unavailable_after": outage_limit}
               if outage_limit is not None and url.startswith("sql+") else {})
    transport = open_transport(url, **options)
    if not transport.shared_across_processes:
        transport.close()
        raise ConfigError(f"{command} cannot use {transport.scheme}:// (it reaches only its own "
                          "process): use sql+<db-url>, rocketmq://namesrv:port or "
                          "rocketmq5://proxy:port")
    return transport
