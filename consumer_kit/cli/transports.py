"""Opening the transport of a command that talks to other processes."""

from __future__ import annotations

from consumer_kit.core.errors import ConfigError
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import Transport


def open_for_processes(url: str, *, command: str) -> Transport:
    """Open `url` for a command whose messages go to or come from other processes.

    Raises:
        ConfigError: the transport reaches only its own process (memory://): a relay would mark
            rows SENT into nowhere, a consumer would wait forever.
    """
    transport = open_transport(url)
    if not transport.shared_across_processes:
        transport.close()
        raise ConfigError(f"{command} cannot use {transport.scheme}:// (it reaches only its own "
                          "process): use sql+<db-url> or rocketmq://host:port")
    return transport
