"""A small RocketMQ admin client speaking the remoting protocol (JSON headers) over TCP.

`mqadmin` starts a JVM per call (2-4 s); the few admin operations consumer-kit needs (create a
topic before consumers start, set a group's retry limit, read a dead-letter queue, look up routes)
are a request and a response each, so they are done here in milliseconds. Only what 4.9.x brokers
and name servers answer is used; nothing here is on the message hot path.

The frame and the request codes are in `remoting`.

>>> admin = RocketMQAdmin("127.0.0.1:9876")        # doctest: +SKIP
>>> admin.create_topic("ORDER_CREATED", queues=4)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.core.messages import retry_topic
from consumer_kit.transports.rocketmq.codec import (
    StoredMessage,
    decode_message,
    decode_messages,
    encode_properties,
)
from consumer_kit.transports.rocketmq.remoting import (
    FLUSH_DISK_TIMEOUT,
    FLUSH_SLAVE_TIMEOUT,
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    GET_BROKER_CLUSTER_INFO,
    GET_BROKER_CONFIG,
    GET_CONSUMER_LIST_BY_GROUP,
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    GET_ROUTEINFO_BY_TOPIC,
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    PULL_MESSAGE,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    PULL_SUBSCRIPTION_FLAG,
    QUERY_CONSUMER_OFFSET,
    QUERY_NOT_FOUND,
    SEND_MESSAGE,
    SLAVE_NOT_AVAILABLE,
    SUCCESS,
    SYSTEM_BUSY,
    TOPIC_NOT_EXIST,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    UPDATE_AND_CREATE_TOPIC,
    VIEW_MESSAGE_BY_ID,
    Response,
    call,
    check,
    loads_json,
)
from consumer_kit.transports.rocketmq.wire import (
    DEFAULT_ADMIN_TIMEOUT,
    DEFAULT_TOPIC_QUEUES,
    ROUTE_WAIT,
    parse_addr,
)


class RocketMQAdmin:
    """Admin operations against one name server (and the brokers it knows).

    Raises `TransportUnavailable` when a server cannot be reached and `TransportError` when it
    refuses a request.
    """

    def __init__(self, namesrv_addr: str, *, cluster: str | None = None,
                 timeout: float = DEFAULT_ADMIN_TIMEOUT) -> None:
        self.namesrv_addrs = parse_addr(namesrv_addr).split(";")
        self.cluster = cluster
        self.timeout = timeout
        self._lock = threading.Lock()

    # -------------------------------------------------------------------------------- name server

    def _namesrv_call(self, code: int, ext: Mapping[str, object] | None = None) -> Response:
        error: TransportUnavailable | None = None
        for addr in self.namesrv_addrs:
            try:
                return call(addr, code, ext, timeout=self.timeout)
            except TransportUnavailable as exc:
                error = exc
        assert error is not None
        raise error

    def master_brokers(self) -> dict[str, str]:
        """`{broker name: master address}` of the cluster (all clusters when none was named)."""
        data = loads_json(check(self._namesrv_call(GET_BROKER_CLUSTER_INFO),
                             "GET_BROKER_CLUSTER_INFO").body)
        names: set[str] | None = None
        if self.cluster:
            names = set(data.get("clusterAddrTable", {}).get(self.cluster, []))
        masters = {}
        for name, info in data.get("brokerAddrTable", {}).items():
            addr = info.get("brokerAddrs", {}).get(str(MASTER_ID))
            if addr and (names is None or name in names):
                masters[name] = addr
        if not masters:
            raise TransportUnavailable("the name server knows no master broker "
                                       f"{'in cluster ' + self.cluster if self.cluster else ''}")
        return masters

    def topic_route(self, topic: str) -> dict[str, Any] | None:
        """The name server's route for `topic`, or None when it has none."""
        response = self._namesrv_call(GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if response.code == TOPIC_NOT_EXIST:
            return None
        route: dict[str, Any] = loads_json(check(response, f"route of {topic}").body)
        return route

    def topic_queues(self, topic: str) -> list[tuple[str, str, int, int]]:
        """`(broker name, master address, queue id, perm)` for each read queue of `topic`."""
        route = self.topic_route(topic)
        if route is None:
            return []
        addrs = {b["brokerName"]: b.get("brokerAddrs", {}).get(str(MASTER_ID))
                 for b in route.get("brokerDatas", [])}
        queues = []
        for qd in route.get("queueDatas", []):
            addr = addrs.get(qd["brokerName"])
            if addr:
                queues += [(qd["brokerName"], addr, q, int(qd["perm"]))
                           for q in range(int(qd["readQueueNums"]))]
        return queues

    # ------------------------------------------------------------------------------------ brokers

    def create_topic(self, topic: str, *, queues: int = DEFAULT_TOPIC_QUEUES,
                     perm: int = PERM_READ | PERM_WRITE, order: bool = False,
                     attributes: str | None = None, route_wait: float = ROUTE_WAIT) -> None:
        """Create or update `topic` on every master broker (like `mqadmin updateTopic -c`), then
        wait up to `route_wait` s (0: not at all) until the name server routes it to each of
        them: a broker registers a new topic on its own schedule (5.x a moment later than
        4.9.x), and a client sending before then fails with "No route info of this topic".
        `attributes` is 5.x's topic attribute string (e.g. `+message.type=FIFO`).

        Raises:
            TransportUnavailable: a broker is down, or the name server still lacks the route.
        """
        masters = self.master_brokers()
        fields: dict[str, object] = {
            "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queues,
            "writeQueueNums": queues, "perm": perm, "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0, "order": order,
        }
        if attributes is not None:
            fields["attributes"] = attributes
        for addr in masters.values():
            check(call(addr, UPDATE_AND_CREATE_TOPIC, fields, timeout=self.timeout),
                  f"create topic {topic}")

        def routed() -> bool:
            # Any permission counts: a broker registers `perm & brokerPermission` (a read-only
            # broker being drained routes 4 for a topic asked with 6).
            route = self.topic_route(topic) or {}
            return {q["brokerName"] for q in route.get("queueDatas", [])} >= masters.keys()

        deadline = time.monotonic() + route_wait
        while route_wait > 0 and not routed():
            if time.monotonic() >= deadline:
                raise TransportUnavailable(f"topic {topic} was created on {sorted(masters)} but "
                                           f"the name server has no route to it after "
                                           f"{route_wait:g} s")
            time.sleep(0.05)

    def update_subscription_group(self, group: str, *, retry_max_times: int,
                                  retry_queues: int = 1) -> None:
        """Create or update `group` with `retryMaxTimes` (`mqadmin updateSubGroup -r`)."""
        body = json.dumps({
            "groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True, "retryQueueNums": retry_queues,
            "retryMaxTimes": retry_max_times, "brokerId": MASTER_ID,
            "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True,
        }).encode()
        for addr in self.master_brokers().values():
            check(call(addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body,
                       timeout=self.timeout), f"update subscription group {group}")

    def prepare_group(self, group: str, *, retry_max_times: int | None = None) -> None:
        """Make `group` ready before its first consumer starts: its `%RETRY%group` topic (the
        C++ client otherwise assigns it only at its next rebalance, ~10 s later, which delays the
        first redelivery) and, when given, its `retryMaxTimes`."""
        if retry_max_times is not None:
            self.update_subscription_group(group, retry_max_times=retry_max_times)
        retry = retry_topic(group)
        if self.topic_route(retry) is None:
            self.create_topic(retry, queues=1)

    def read_queue(self, broker_addr: str, topic: str, queue_id: int, *, group: str,
                   offset: int = 0, batch: int = 32) -> list[StoredMessage]:
        """Pull every message of one queue from `offset` without committing anything."""
        found: list[StoredMessage] = []
        while True:
            response = call(broker_addr, PULL_MESSAGE, {
                "consumerGroup": group, "topic": topic, "queueId": queue_id,
                "queueOffset": offset, "maxMsgNums": batch, "sysFlag": PULL_SUBSCRIPTION_FLAG,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0,
                "expressionType": "TAG",
            }, timeout=self.timeout)
            if response.code == SUCCESS:
                messages = list(decode_messages(response.body))
                found += messages
                offset = int(response.ext.get("nextBeginOffset", offset + len(messages)))
                if not messages:
                    return found
                continue
            if response.code in (PULL_NOT_FOUND, PULL_OFFSET_MOVED, PULL_RETRY_IMMEDIATELY):
                next_offset = int(response.ext.get("nextBeginOffset", offset))
                if next_offset <= offset:
                    return found
                offset = next_offset
                continue
            raise TransportError(f"pull {topic}/{queue_id} failed: code {response.code} "
                                 f"{response.remark}")

    def read_topic(self, topic: str, *, group: str) -> list[StoredMessage]:
        """Every stored message of `topic`, making it readable first when it is write-only
        (the broker creates `%DLQ%` topics with write permission only)."""
        with self._lock:
            queues = self.topic_queues(topic)
            if any(not perm & PERM_READ for _b, _a, _q, perm in queues):
                count = max(q for _b, _a, q, _p in queues) + 1
                self.create_topic(topic, queues=count, perm=PERM_READ | PERM_WRITE,
                                  route_wait=0)  # pulled from the broker: no route needed
            messages: list[StoredMessage] = []
            for _broker, addr, queue_id, _perm in queues:
                messages += self.read_queue(addr, topic, queue_id, group=group)
        return messages

    # ------------------------------------------------------------------ one message, one group

    def view_message(self, broker_addr: str, commit_log_offset: int) -> StoredMessage | None:
        """The message stored at `commit_log_offset` of one broker's commit log, with every
        property (VIEW_MESSAGE_BY_ID), or None when that broker has none there.

        Raises:
            TransportUnavailable: the broker did not answer.
        """
        response = call(broker_addr, VIEW_MESSAGE_BY_ID, {"offset": commit_log_offset},
                        timeout=self.timeout)
        if response.code != SUCCESS or not response.body:
            return None
        try:
            return decode_message(response.body)
        except (TransportError, ValueError, struct.error):  # not a message start
            return None

    def queue_lag(self, broker_addr: str, topic: str, queue_id: int, *, group: str) -> int:
        """Messages of one queue `group` has not consumed: the queue's max offset minus the
        group's committed offset there (its min offset when the group committed none)."""
        where = {"topic": topic, "queueId": queue_id}
        top = int(check(call(broker_addr, GET_MAX_OFFSET, where, timeout=self.timeout),
                         f"max offset of {topic}/{queue_id}").ext.get("offset", 0))
        response = call(broker_addr, QUERY_CONSUMER_OFFSET, {**where, "consumerGroup": group},
                        timeout=self.timeout)
        if response.code == QUERY_NOT_FOUND:
            response = check(call(broker_addr, GET_MIN_OFFSET, where, timeout=self.timeout),
                              f"min offset of {topic}/{queue_id}")
        done = int(check(response, f"offset of {group} in {topic}/{queue_id}").ext.get(
            "offset", 0))
        return max(0, top - done)

    def consumer_ids(self, broker_addr: str, group: str) -> list[str]:
        """The client ids of `group`'s consumers one broker knows (their heartbeats)."""
        response = call(broker_addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group},
                        timeout=self.timeout)
        if response.code != SUCCESS or not response.body:  # no consumer online
            return []
        return [str(c) for c in loads_json(response.body).get("consumerIdList") or []]

    def subscription_groups(self, broker_addr: str) -> dict[str, dict[str, Any]]:
        """`{group: config}` of one broker (GET_ALL_SUBSCRIPTIONGROUP_CONFIG): `retryMaxTimes`,
        `retryQueueNums`, ..."""
        body = check(call(broker_addr, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout=self.timeout),
                      "GET_ALL_SUBSCRIPTIONGROUP_CONFIG").body
        table: dict[str, dict[str, Any]] = loads_json(body).get("subscriptionGroupTable") or {}
        return table

    def broker_config(self, broker_addr: str) -> dict[str, str]:
        """One broker's configuration (GET_BROKER_CONFIG), e.g. `messageDelayLevel`."""
        body = check(call(broker_addr, GET_BROKER_CONFIG, timeout=self.timeout),
                      "GET_BROKER_CONFIG").body.decode("utf-8")
        config = {}
        for line in body.splitlines():
            name, sep, value = line.partition("=")
            if sep:
                config[name.strip()] = value.strip()
        return config

    def send_message(self, broker_addr: str, *, topic: str, body: bytes,
                     properties: Mapping[str, str], producer_group: str, born_timestamp_ms: int,
                     flag: int = 0, sys_flag: int = 0, reconsume_times: int | None = None,
                     max_reconsume_times: int | None = None) -> dict[str, str]:
        """Store one message on one broker (SEND_MESSAGE, to a queue the broker picks); return
        the response fields (`msgId`, `queueId`, `queueOffset`).

        For a `%RETRY%group` topic the broker moves the message to `%DLQ%group` when
        `reconsume_times >= max_reconsume_times` (SendMessageProcessor.handleRetryAndDLQ).

        Raises:
            TransportUnavailable: the broker did not answer, or answered busy.
            TransportError: the broker refused the message.
        """
        ext: dict[str, object] = {
            "producerGroup": producer_group, "topic": topic, "defaultTopic": "TBW102",
            "defaultTopicQueueNums": DEFAULT_TOPIC_QUEUES, "queueId": -1, "sysFlag": sys_flag,
            "bornTimestamp": born_timestamp_ms, "flag": flag,
            "properties": encode_properties(properties), "unitMode": False, "batch": False,
        }
        if reconsume_times is not None:
            ext["reconsumeTimes"] = reconsume_times
        if max_reconsume_times is not None:
            ext["maxReconsumeTimes"] = max_reconsume_times
        response = call(broker_addr, SEND_MESSAGE, ext, body, timeout=self.timeout)
        if response.code == SYSTEM_BUSY:
            raise TransportUnavailable(f"broker {broker_addr} is busy: {response.remark}")
        if response.code not in _STORED:
            raise TransportError(f"send to {topic} on {broker_addr} failed: code "
                                 f"{response.code} {response.remark}".strip())
        return response.ext


#: Send answers that mean the message is stored (flush or replication merely lagging).
_STORED = frozenset({SUCCESS, FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT})
