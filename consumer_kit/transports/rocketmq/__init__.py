"""The `rocketmq://host:port` transport on rocketmq-client-python 2.0.0 (ctypes over librocketmq).

`transport` sends and makes consumers; `consumer` is the push consumer with its one routing
callback; `native` loads the client and its library lazily; `wire` holds the pure functions of
what travels (addresses, delay levels, bodies, properties, errors); `admin` is a small remoting
client for topics, groups and dead letters. docs/rocketmq.md lists the client's traps.
"""

from __future__ import annotations

from consumer_kit.transports.rocketmq.consumer import RocketMQConsumer
from consumer_kit.transports.rocketmq.transport import RocketMQTransport
from consumer_kit.transports.rocketmq.wire import delay_level, encode_body, parse_addr

__all__ = ["RocketMQConsumer", "RocketMQTransport", "delay_level", "encode_body", "parse_addr"]
