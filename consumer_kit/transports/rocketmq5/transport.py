"""The `rocketmq5://host:port` transport: Apache's rocketmq-python-client 5.x over gRPC to a
RocketMQ 5 proxy.

What the 5.x model forces on this module (docs/rocketmq5.md has the checked facts):

- Topics have a message type. A NORMAL topic refuses delayed and ordered sends, a FIFO topic
  takes only sends with a message group, a DELAY topic only delayed ones (MIXED takes all, when
  the broker has `enableMixedMessageType=true`). `ordered_topics` are sent with a message group
  (the message's `sharding_key`, else its first key, i.e. `ckit_id`); a mismatch is refused
  before sending, in one line that says what to change.
- `delay` becomes a delivery timestamp in whole epoch seconds (the client's unit), rounded up.
- Bodies are bytes end to end (no base64); the proxy refuses an empty body.
- The proxy cannot create topics or configure groups, and keeps no reason with a redelivery: give
  the name server (`rocketmq5://proxy:8081?namesrv=host:9876`, or `namesrv=`) for
  `ensure_topic`/`create_topics`, `max_reconsume_times`, `dead_letters` and the reason-carrying
  copy to `%DLQ%group` (see consumer.py).

>>> t = RocketMQ5Transport("127.0.0.1:8081?namesrv=127.0.0.1:9886")   # doctest: +SKIP
>>> t.send(OutgoingMessage("ORDER_CREATED", b'{"id": 1}'))              # doctest: +SKIP
SendResult(broker_message_id='0102FC...', queue_id=None, queue_offset=None)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from consumer_kit.core.envelope import PROP_ID
from consumer_kit.core.errors import (
    ConfigError,
    EmptyBody,
    MessageTooLarge,
    TransportClosed,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.messages import (
    Delivery,
    OutgoingMessage,
    SendResult,
    Subscription,
    dlq_topic,
)
from consumer_kit.transports.base import Transport
from consumer_kit.transports.rocketmq5 import client
from consumer_kit.transports.rocketmq5.admin import RocketMQ5Admin
from consumer_kit.transports.rocketmq5.cluster import name_server_problem
from consumer_kit.transports.rocketmq5.consumer import AnswerCallback, RocketMQ5Consumer
from consumer_kit.transports.rocketmq5.route import Route, query_route, route_failure
from consumer_kit.transports.rocketmq5.wire import (
    DEFAULT_AWAIT_SECONDS,
    DEFAULT_INVISIBLE_SECONDS,
    DEFAULT_PRODUCER_TIMEOUT,
    DEFAULT_ROCKETMQ5_MAX_BODY_BYTES,
    DEFAULT_ROCKETMQ5_RETRY_DELAYS,
    PROXY_MIN_AWAIT_SECONDS,
    check_property,
    delivery_seconds,
    message_group,
    parse_endpoint,
    stored_delivery,
    translate,
)

log = logging.getLogger("consumer_kit.transports.rocketmq5")

DEFAULT_ADMIN_TIMEOUT = 5.0
_ROUTE_FAILURE = "failed to fetch topic"


class RocketMQ5Transport(Transport):
    """Send to and consume from a RocketMQ 5 proxy through rocketmq-python-client 5.x.

    Args:
        endpoint: the proxy's gRPC `host:port` (`;`-separated for several), optionally with
            `?namesrv=host:port`.
        namesrv: the name server, for the admin operations the proxy lacks (see module doc).
        send_timeout: seconds per gRPC request.
        max_body_bytes: largest body `send` accepts.
        ordered_topics: FIFO topics, sent with a message group and consumed by FIFO groups.
        max_reconsume_times: when set (and `namesrv` known), each consumer's group gets this
            retry limit on the broker before the consumer starts; a consumer refuses to start
            when the proxy then reports another limit (a name server of another cluster).
        retry_delays: RECONSUME_LATER back-off in seconds by redelivery (the last repeats).
        invisible_seconds: how long a received message stays hidden while its callback runs;
            a callback that takes longer gets the message delivered again meanwhile.
        await_seconds: the long poll of one receive (bounds `shutdown`); at least 5, the
            proxy's shortest.
        create_topics: create missing topics (NORMAL, or FIFO for `ordered_topics`) before a
            consumer starts or a message is sent, and make the group of an ordered consumer a
            FIFO group; needs `namesrv`.

    Raises:
        ConfigError: a bad URL or option, e.g. `await_seconds` below 5 (the client is loaded
            on first use).
    """

    scheme = "rocketmq5"

    def __init__(
        self,
        endpoint: str,
        *,
        namesrv: str | None = None,
        send_timeout: float = DEFAULT_PRODUCER_TIMEOUT,
        max_body_bytes: int = DEFAULT_ROCKETMQ5_MAX_BODY_BYTES,
        thread_count: int | None = None,
        ordered_topics: Iterable[str] = (),
        max_reconsume_times: int | None = None,
        retry_delays: Sequence[float] = DEFAULT_ROCKETMQ5_RETRY_DELAYS,
        invisible_seconds: float = DEFAULT_INVISIBLE_SECONDS,
        await_seconds: float = DEFAULT_AWAIT_SECONDS,
        create_topics: bool = False,
        topic_queues: int = 4,
        admin_timeout: float = DEFAULT_ADMIN_TIMEOUT,
    ) -> None:
        self.endpoint, options = parse_endpoint(endpoint)
        namesrv = namesrv or options.get("namesrv")
        if max_body_bytes <= 0 or send_timeout <= 0 or invisible_seconds <= 0:
            raise ConfigError("max_body_bytes, send_timeout and invisible_seconds must be positive")
        if not await_seconds >= PROXY_MIN_AWAIT_SECONDS:
            # a shorter await never shortens the poll, and with a short send_timeout it leaves
            # the request's deadline below the proxy's minimum: every receive fails (40018)
            raise ConfigError(f"await_seconds={await_seconds:g} is below the RocketMQ 5 proxy's "
                              f"shortest long poll ({PROXY_MIN_AWAIT_SECONDS:g} s): use at least "
                              f"{PROXY_MIN_AWAIT_SECONDS:g}")
        if thread_count is not None and thread_count < 1:
            raise ConfigError("thread_count must be at least 1")
        if max_reconsume_times is not None and max_reconsume_times < 0:
            raise ConfigError("max_reconsume_times must not be negative")
        if (create_topics or max_reconsume_times is not None) and not namesrv:
            raise ConfigError("create_topics and max_reconsume_times need the name server: "
                              "rocketmq5://proxy:port?namesrv=host:port")
        self.send_timeout = send_timeout
        self.max_body_bytes = max_body_bytes
        self.thread_count = thread_count
        self.ordered_topics = frozenset(ordered_topics)
        self.max_reconsume_times = max_reconsume_times
        self.retry_delays = tuple(float(s) for s in retry_delays)
        self.invisible_seconds = invisible_seconds
        self.await_seconds = await_seconds
        self.create_topics = create_topics
        self.topic_queues = topic_queues
        self.namesrv = namesrv or None
        self.admin = RocketMQ5Admin(namesrv, timeout=admin_timeout) if namesrv else None
        self._producer: Any = None
        self._configuration: Any = None
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {}
        #: topics `ensure_topic` found or created
        self._known_topics: set[str] = set()
        self._closed = False

    # ------------------------------------------------------------------------------- the client

    def check(self) -> None:
        """Fail fast when rocketmq-python-client is missing or its package was broken by
        rocketmq-client-python (an unreachable proxy is an outage, not reported here).

        Raises:
            ConfigError: what is wrong and the pip command that fixes it.
        """
        client.v5()

    @property
    def configuration(self) -> Any:
        """The 5.x client configuration of this transport (loads the client)."""
        if self._configuration is None:
            self._configuration = client.configuration(self.endpoint, self.send_timeout)
        return self._configuration

    def _get_producer(self) -> Any:
        with self._lock:
            if self._closed:
                raise TransportClosed("the RocketMQ 5 transport is closed")
            if self._producer is None:
                producer = client.v5().Producer(self.configuration)
                try:
                    producer.startup()
                except Exception as exc:
                    raise translate(exc, f"starting a producer on {self.endpoint}") from exc
                self._producer = producer
                log.info("producer started on %s", self.endpoint)
            return self._producer

    def route(self, topic: str) -> Route:
        """The proxy's route of `topic` (cached; created first when `create_topics` is on).

        Raises:
            TransportUnavailable / TransportError / ConfigError: see `query_route`; also
                TransportError when the name server is another cluster's (`cluster`).
        """
        cached = self._routes.get(topic)
        if cached is not None:
            return cached
        if self.create_topics:  # only when the name server has no route (the proxy would
            self.ensure_topic(topic)  # remember a topic it was asked for before it existed)
        found = query_route(self.endpoint, topic, timeout=self.send_timeout)
        self._check_name_server(found)  # before the group is written through the name server
        self._routes[topic] = found
        return found

    def _check_name_server(self, route: Route) -> None:
        """Refuse a name server of another cluster before a consumer's group is written through
        it (see `cluster`); one that cannot be reached is left to those writes, which fail on
        their own (sending needs no name server)."""
        if self.admin is None:
            return
        try:
            known = self.admin.topic_route(route.topic)
        except TransportUnavailable as exc:
            log.warning("name server %s not checked against the proxy's cluster: %s",
                        self.namesrv, exc)
            return
        problem = name_server_problem(known, route, namesrv=str(self.namesrv),
                                      endpoint=self.endpoint)
        if problem:
            raise TransportError(problem)

    def failure(self, exc: BaseException, what: str, *, topic: str) -> TransportError:
        """`exc` from the client as one consumer-kit error (a failed route lookup diagnosed)."""
        if _ROUTE_FAILURE in str(exc):
            return route_failure(self.endpoint, topic, exc, what)
        return translate(exc, what)

    # ----------------------------------------------------------------------------------- sending

    def send(self, message: OutgoingMessage) -> SendResult:
        """Send synchronously; return the message id the client assigned (the broker's
        UNIQ_KEY).

        Raises:
            MessageTooLarge: the body is over `max_body_bytes` (nothing sent).
            TransportUnavailable: the proxy cannot be reached or timed out.
            TransportClosed: the transport was closed (nothing sent, no message to blame).
            TransportError: the topic does not exist or refuses this kind of message, an empty
                body, a reserved property.
        """
        msg_id = message.properties.get(PROP_ID) or (message.keys[0] if message.keys else "-")
        what = f"sending message {msg_id} to {message.topic}"
        body = bytes(message.body)
        if len(body) > self.max_body_bytes:
            raise MessageTooLarge(f"message {msg_id}: body of {len(body)} bytes exceeds the "
                                  f"limit of {self.max_body_bytes}")
        group = None
        if message.topic in self.ordered_topics:
            group = message_group(message.sharding_key
                                  or (message.keys[0] if message.keys else None) or msg_id)
            if message.delay:
                raise TransportError(f"{what}: {message.topic} is an ordered (FIFO) topic; "
                                     "RocketMQ 5 cannot delay a FIFO message")
        return self.send_raw(message.topic, body, tags=message.tags, keys=message.keys,
                             properties=message.properties, delay=message.delay,
                             message_group=group, what=what)

    def send_raw(self, topic: str, body: bytes, *, tags: str | None, keys: Sequence[str],
                 properties: Mapping[str, str], delay: float | None = None,
                 message_group: str | None = None, what: str | None = None) -> SendResult:
        """Send one message as given (the consumer's copies to `%DLQ%group` use this too)."""
        what = what or f"sending to {topic}"
        if not body:
            raise EmptyBody(f"{what}: RocketMQ 5 refuses an empty body")
        for name, value in properties.items():
            check_property(name, value)
        if self.create_topics and not topic.startswith("%"):
            self.ensure_topic(topic)
        lib = client.v5()
        producer = self._get_producer()
        try:
            out = lib.OrderedKeysMessage(keys)
            out.topic = topic
            out.body = body
            if tags:
                out.tag = tags
            for name, value in properties.items():
                out.add_property(name, value)
            if message_group:
                out.message_group = message_group
            if delay and delay > 0:
                out.delivery_timestamp = delivery_seconds(delay)
            receipt = producer.send(out)
        except TransportError:
            raise
        except Exception as exc:
            if _ROUTE_FAILURE in str(exc):  # deleted? the next send asks the name server again
                self._known_topics.discard(topic)
            error = self.failure(exc, what, topic=topic)
            log.warning("%s", error)
            raise error from exc
        offset = getattr(receipt, "offset", None)
        return SendResult(str(receipt.message_id), None,
                          int(offset) if isinstance(offset, int) else None)

    # ---------------------------------------------------------------------------------- admin

    def _need_admin(self, what: str) -> RocketMQ5Admin:
        if self.admin is None:
            raise ConfigError(f"{what} needs the name server: rocketmq5://{self.endpoint}"
                              "?namesrv=host:port")
        return self.admin

    def ensure_topic(self, topic: str) -> None:
        """Create `topic` (FIFO when it is in `ordered_topics`, else NORMAL) when the name
        server has no route for it (asked once per topic, and again after a send to it failed
        for want of a route: an operator may have deleted it). A no-op without the name server.

        Raises:
            TransportUnavailable: the name server or a broker cannot be reached.
        """
        if self.admin is None or topic in self._known_topics:
            return
        if self.admin.topic_route(topic) is None:
            kind = "FIFO" if topic in self.ordered_topics else "NORMAL"
            self.admin.create_typed_topic(topic, message_type=kind, queues=self.topic_queues)
            log.info("created %s topic %s with %d queues", kind, topic, self.topic_queues)
        # once per topic: the producer calls this before every send (it used to ask the name
        # server each time, one more round trip per message)
        self._known_topics.add(topic)

    def prepare_group(self, group: str, *, fifo: bool = False) -> None:
        """Before a consumer of `group` starts: set its retry limit and whether it is a FIFO
        group (when `max_reconsume_times` is configured, or when `fifo` with `create_topics`:
        the retry limit then stays the group's own, 16 for a new one), and make `%DLQ%group`
        ready for reason-carrying copies. Best effort when the group is not written; a no-op
        without the name server.

        Raises:
            TransportError: the group is written and the broker refused or is down.
        """
        if self.admin is None:
            return
        write = self.max_reconsume_times is not None or (fifo and self.create_topics)
        try:
            if write:
                retries = self.max_reconsume_times
                if retries is None:
                    retries = self.admin.group_retry_max_times(group)
                self.admin.update_group(group, retry_max_times=retries, fifo=fifo)
            self.admin.prepare_dead_letters(group)
        except TransportError as exc:
            if write:
                raise
            log.warning("consumer %s: could not prepare the group on the broker: %s", group, exc)

    def dead_letters(self, group: str) -> list[Delivery]:
        """Messages in `%DLQ%group`, read from the broker without consuming them; the reason
        of the last RECONSUME_LATER is each one's `last_error` (for copies made by this
        transport).

        Raises:
            ConfigError: no name server configured.
        """
        admin = self._need_admin("dead_letters()")
        topic = dlq_topic(group)
        if admin.topic_route(topic) is None:
            return []
        return [stored_delivery(m.topic, m.body, m.properties, reconsume_times=m.reconsume_times,
                                queue_id=m.queue_id, queue_offset=m.queue_offset,
                                born_timestamp_ms=m.born_timestamp_ms)
                for m in admin.read_topic(topic, group=f"ckit-dlq-reader-{group}")]

    # --------------------------------------------------------------------------------- consuming

    def consumer(
        self,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: AnswerCallback,
        *,
        threads: int = 1,
    ) -> RocketMQ5Consumer:
        """A consumer of `group` over `subscriptions`; `callback` answers a `ConsumeStatus` or a
        `Verdict` (whose reason goes with the redelivery and into the dead letter)."""
        if not group:
            raise ConfigError("consumer group must not be empty")
        if not subscriptions:
            raise ConfigError(f"consumer group {group}: no subscriptions")
        return RocketMQ5Consumer(self, group, subscriptions, callback,
                                 threads=self.thread_count or max(1, threads))

    def close(self) -> None:
        """Shut the producer down (consumers are shut down by their owners). Idempotent."""
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.shutdown()
            except Exception:
                log.exception("producer on %s: shutdown failed", self.endpoint)
