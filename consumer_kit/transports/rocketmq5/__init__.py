"""The `rocketmq5://host:port` transport: rocketmq-python-client 5.x (gRPC) to a RocketMQ 5 proxy.

Modules: `transport` (sending, topics, dead letters), `consumer` (SimpleConsumer workers and
what each answer does to a message), `wire` (properties, delivery times, conversions, errors),
`route` (one direct QueryRoute: topic types, and why a lookup failed), `settings` (the group's
settings from the proxy against the configuration), `admin` (typed topics and
FIFO groups over the name server), `client` (loading the optional client).
"""

from __future__ import annotations

from consumer_kit.transports.rocketmq5.consumer import RocketMQ5Consumer
from consumer_kit.transports.rocketmq5.transport import RocketMQ5Transport

__all__ = ["RocketMQ5Consumer", "RocketMQ5Transport"]
