"""Opening the transport of a command that talks to other processes."""

from __future__ import annotations

from typing import Any

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import DEFAULT_MQ_PREFIX
from consumer_kit.core.urls import mask_url
from consumer_kit.transports import open_transport
from consumer_kit.transports.base import Transport


def open_for_processes(url: str, *, command: str, outage_limit: float | None = None,
                       mq_prefix: str = DEFAULT_MQ_PREFIX) -> Transport:
    """Open `url` for a command whose messages go to or come from other processes;
    `outage_limit` bounds how long the SQL transport waits out its database (a `--once` run's
    `--give-up-after`; other transports bound their waits themselves), `mq_prefix` names its
    tables (`--mq-prefix`, as `ckit db init` made them).

    Raises:
        ConfigError: the transport reaches only its own process (memory://): a relay would mark
            rows SENT into nowhere, a consumer would wait forever; or `mq_prefix` is not the
            default for a transport that is not `sql+`.
    """
    options: dict[str, Any] = {}
    if url.startswith("sql+"):
        options["table_prefix"] = mq_prefix
        if outage_limit is not None:
            options["unavailable_after"] = outage_limit
    elif mq_prefix != DEFAULT_MQ_PREFIX:
        raise ConfigError(f"--mq-prefix {mq_prefix!r} names the SQL transport's tables, but "
                          f"{command} was given --transport {mask_url(url)!r}: drop it (or "
                          "unset CKIT_MQ_PREFIX)")
    transport = open_transport(url, **options)
    if not transport.shared_across_processes:
        transport.close()
        raise ConfigError(f"{command} cannot use {transport.scheme}:// (it reaches only its own "
                          "process): use sql+<db-url>, rocketmq://namesrv:port or "
                          "rocketmq5://proxy:port")
    return transport
