"""Admin operations the gRPC proxy does not offer, done over the name server and brokers with the
remoting admin client of the `rocketmq://` transport: typed topics (5.x `message.type`), FIFO
groups with their retry limit, the group's dead-letter topic, reading dead letters.

Only used when the transport is given the name server (`rocketmq5://proxy?namesrv=host:port`).
"""

from __future__ import annotations

import json

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.messages import dlq_topic
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin
from consumer_kit.transports.rocketmq.remoting import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    call,
    check,
)

MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
DEFAULT_TOPIC_QUEUES = 4
#: RocketMQ's DLQ_NUMS_PER_GROUP
DLQ_QUEUES = 1
#: A new subscription group's `retryMaxTimes` on the broker
DEFAULT_RETRY_MAX_TIMES = 16


class RocketMQ5Admin(RocketMQAdmin):
    """`RocketMQAdmin` with 5.x topic types and FIFO groups."""

    def create_typed_topic(self, topic: str, *, message_type: str = "NORMAL",
                           queues: int = DEFAULT_TOPIC_QUEUES,
                           perm: int = PERM_READ | PERM_WRITE) -> None:
        """Create or update `topic` with `message.type=message_type` on every master broker
        (`mqadmin updateTopic -a +message.type=...`). MIXED needs the broker's
        `enableMixedMessageType=true`.

        Returns once the name server routes it (see `RocketMQAdmin.create_topic`).

        Raises:
            ConfigError: an unknown message type.
            TransportError: the broker refused (e.g. MIXED not enabled).
            TransportUnavailable: a broker is down, or the name server still lacks the route.
        """
        if message_type not in MESSAGE_TYPES:
            raise ConfigError(f"unknown message type {message_type!r}: use one of "
                              f"{', '.join(MESSAGE_TYPES)}")
        self.create_topic(topic, queues=queues, perm=perm, order=message_type == "FIFO",
                          attributes=f"+message.type={message_type}")

    def update_group(self, group: str, *, retry_max_times: int, fifo: bool = False) -> None:
        """Create or update a consumer group: `retryMaxTimes` (deliveries = 1 + that) and
        whether it consumes in order (a FIFO group)."""
        body = json.dumps({
            "groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True, "consumeMessageOrderly": fifo, "retryQueueNums": 1,
            "retryMaxTimes": retry_max_times, "brokerId": MASTER_ID,
            "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
        }).encode()
        for addr in self.master_brokers().values():
            check(call(addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body,
                       timeout=self.timeout), f"update consumer group {group}")

    def group_retry_max_times(self, group: str) -> int:
        """The `retryMaxTimes` `group` has on the first master broker that knows it, else the
        broker's default for a new group (so making a group FIFO keeps its retry limit)."""
        for addr in self.master_brokers().values():
            config = self.subscription_groups(addr).get(group)
            if config and config.get("retryMaxTimes") is not None:
                return int(config["retryMaxTimes"])
        return DEFAULT_RETRY_MAX_TIMES

    def prepare_dead_letters(self, group: str) -> None:
        """Create `%DLQ%group` (readable and writable) when it is missing, so the transport can
        copy a message there with its reason at its last attempt."""
        topic = dlq_topic(group)
        if self.topic_route(topic) is None:
            self.create_topic(topic, queues=DLQ_QUEUES)
