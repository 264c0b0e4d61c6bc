"""Transports: `memory://` (in-process, for tests), `sql+<sqlalchemy-url>`,
`rocketmq://host:port` (a name server, rocketmq-client-python 2.0.0) and `rocketmq5://host:port`
(a RocketMQ 5 proxy's gRPC endpoint, rocketmq-python-client 5.x).

>>> t = open_transport("memory://doc")
>>> t.scheme
'memory'
"""

from __future__ import annotations

from typing import Any

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import (
    ConsumeStatus,
    Delivery,
    DeliveryCallback,
    OutgoingMessage,
    SendResult,
    Subscription,
    Verdict,
)
from consumer_kit.core.urls import mask_url
from consumer_kit.transports.base import Consumer, Transport

__all__ = [
    "ConsumeStatus",
    "Consumer",
    "Delivery",
    "DeliveryCallback",
    "OutgoingMessage",
    "SendResult",
    "Subscription",
    "Transport",
    "Verdict",
    "open_transport",
]

def open_transport(url: str, **options: Any) -> Transport:
    """Open the transport named by `url`; `options` go to the backend's constructor.

    Raises:
        ConfigError: unknown scheme or malformed URL (the message lists the valid schemes).
    """
    if not url:
        raise ConfigError("no transport URL given (use memory://NAME, sql+<db-url>, "
                          "rocketmq://host:port or rocketmq5://host:port)")
    if url.startswith("memory://"):
        from consumer_kit.transports.memory import MemoryTransport

        return MemoryTransport(**options)
    if url.startswith("sql+"):
        from consumer_kit.transports.sql import SqlTransport

        return SqlTransport(url[len("sql+"):], **options)
    if url.startswith("rocketmq://"):
        from consumer_kit.transports.rocketmq import RocketMQTransport

        return RocketMQTransport(url[len("rocketmq://"):], **options)
    if url.startswith("rocketmq5://"):
        from consumer_kit.transports.rocketmq5 import RocketMQ5Transport

        return RocketMQ5Transport(url, **options)
    raise ConfigError(
        f"unknown transport URL {mask_url(url)!r}: use memory://NAME, sql+<sqlalchemy-url> "
        "(e.g. sql+sqlite:///ckit-mq.db), rocketmq://host:port (a name server) or "
        "rocketmq5://host:port (a RocketMQ 5 proxy)"
    )
