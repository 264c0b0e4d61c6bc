"""The `rocketmq://host:port` transport: rocketmq-client-python 2.0.0 (ctypes over librocketmq).

What the old C++ client forces on this module (docs/rocketmq.md and the notes below):

- Bodies travel as NUL-terminated C strings, so a body that is not NUL-free valid UTF-8 is sent as
  base64 with the property ``ckit_enc=b64`` and decoded back before the callback sees it.
- A received message's properties cannot be listed, only looked up by name: the envelope names are
  always read, and a sender adds ``ckit_props`` (the names of its other properties) so they come
  back too. Messages from other producers deliver the envelope names and `extra_properties`.
- One callback per PushConsumer: every topic of a `consumer(...)` call goes to one routing
  callback, registered once, which catches everything and always returns a status (an exception
  escaping a ctypes callback hands the C++ client an undefined status: it may ack and lose it).
- The native client answers a RECONSUME_LATER for the whole pulled batch and sends every message
  of it back: a concurrent consumer therefore sends a failed message back itself (to
  `%RETRY%group` with the next delay level and its reason as `ckit_reason`, or to `%DLQ%group`
  once the group's `retryMaxTimes` is spent) and answers success (see `sendback`).
- A running PushConsumer and its ctypes callback are kept alive by a module-level registry until
  `shutdown()` has returned: a collected callback crashes the process.
- `Message` objects have no `__del__` in 2.0.0: every sent message's C object is freed right
  after `send_sync` returns (the C++ client copies what it sends).
- Delays are RocketMQ delay levels: `delay` seconds become the first level at or above them
  (the broker's `messageDelayLevel`, given as `delay_levels`); longer delays use the last level.

>>> transport = RocketMQTransport("127.0.0.1:9876")               # doctest: +SKIP
>>> transport.send(OutgoingMessage("ORDER_CREATED", b'{"id": 1}'))  # doctest: +SKIP
SendResult(broker_message_id='0100007F...', queue_id=None, queue_offset=0)
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from consumer_kit.core.envelope import ENC_BASE64, PROP_ENC, PROP_ID, PROP_NAMES
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
    DeliveryCallback,
    OutgoingMessage,
    SendResult,
    Subscription,
    dlq_topic,
)
from consumer_kit.transports.base import Transport
from consumer_kit.transports.rocketmq import native
from consumer_kit.transports.rocketmq.admin import RocketMQAdmin, StoredMessage
from consumer_kit.transports.rocketmq.consumer import RocketMQConsumer
from consumer_kit.transports.rocketmq.liveness import (
    DEFAULT_MAX_REBUILDS,
    DEFAULT_STALL_AFTER,
    MIN_STALL_AFTER,
    OFFSET_COMMIT_SECONDS,
)
from consumer_kit.transports.rocketmq.resolve import for_native, resolved
from consumer_kit.transports.rocketmq.sendback import DEFAULT_PATIENCE
from consumer_kit.transports.rocketmq.wire import (
    DEFAULT_ADMIN_TIMEOUT,
    DEFAULT_CLIENT_LOG_LEVEL,
    DEFAULT_DELAY_LEVELS,
    DEFAULT_PRODUCER_GROUP,
    DEFAULT_ROCKETMQ_MAX_BODY_BYTES,
    DEFAULT_SEND_TIMEOUT,
    DEFAULT_TOPIC_QUEUES,
    ENVELOPE_PROPERTIES,
    check_property,
    delay_level,
    encode_body,
    make_delivery,
    parse_addr,
    read_properties,
    translate,
)

log = logging.getLogger(__name__)

class RocketMQTransport(Transport):
    """Send to and consume from RocketMQ through rocketmq-client-python 2.0.0.

    Args:
        addr: name server `host:port` (`;`-separated for several).
        producer_group: the producer group of this process's one producer.
        send_timeout: seconds the C++ client waits for each send.
        max_body_bytes: largest wire body (after base64, if any) accepted by `send`.
        thread_count: when set, every consumer uses this many consume threads (else the
            `threads` argument of `consumer`).
        ordered_topics: topics sent with `send_orderly_with_sharding_key` (the message's
            `sharding_key`, else its first key) and consumed with an orderly PushConsumer.
        max_reconsume_times: when set, each consumer's group is configured on the broker with
            this `retryMaxTimes` before the consumer starts (the old C++ client cannot carry it).
        delay_levels: the broker's `messageDelayLevel` in seconds (for mapping `delay`).
        create_topics: create missing topics (with `topic_queues` queues) before a consumer
            starts or a message is sent; routes are otherwise only learnt every 30 s.
        extra_properties: more property names to read on receive for messages from producers
            that do not send `ckit_props`.
        send_back_patience: seconds after which a consumer that cannot send a failed message
            back (to `%RETRY%group` or `%DLQ%group`) because the broker is unreachable says so;
            it keeps trying until the broker answers or the consumer stops. A broker that
            refuses the copy makes it fall back to RECONSUME_LATER at once.
        client_log_dir / client_log_level: the C++ client's own log (default `~/logs/rocketmq-cpp`,
            level `warn`).
        stall_after: seconds a consumer may receive nothing while the broker holds messages in
            the queues it owns before its watchdog rebuilds it (0: no watchdog; else at least
            10, twice the client's offset commit interval); see
            `consumer_kit.transports.rocketmq.liveness`.
        max_rebuilds: rebuilds after which a stalled consumer reports a `failure` instead
            (`ckit consume` then exits 3 for its supervisor to restart it).

    Raises:
        ConfigError: a bad address or option, or librocketmq missing (on first use).
    """

    scheme = "rocketmq"

    def __init__(
        self,
        addr: str,
        *,
        producer_group: str = DEFAULT_PRODUCER_GROUP,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        compress_level: int | None = None,
        max_body_bytes: int = DEFAULT_ROCKETMQ_MAX_BODY_BYTES,
        thread_count: int | None = None,
        ordered_topics: Iterable[str] = (),
        max_reconsume_times: int | None = None,
        delay_levels: Sequence[float] = DEFAULT_DELAY_LEVELS,
        create_topics: bool = False,
        topic_queues: int = DEFAULT_TOPIC_QUEUES,
        extra_properties: Iterable[str] = (),
        admin_timeout: float = DEFAULT_ADMIN_TIMEOUT,
        send_back_patience: float = DEFAULT_PATIENCE,
        client_log_dir: str | None = None,
        client_log_level: str | None = DEFAULT_CLIENT_LOG_LEVEL,
        stall_after: float = DEFAULT_STALL_AFTER,
        max_rebuilds: int = DEFAULT_MAX_REBUILDS,
    ) -> None:
        self.addr = parse_addr(addr)
        if not producer_group:
            raise ConfigError("producer_group must not be empty")
        if max_body_bytes <= 0 or send_timeout <= 0:
            raise ConfigError("max_body_bytes and send_timeout must be positive")
        if stall_after < 0 or max_rebuilds < 0:
            raise ConfigError("stall_after and max_rebuilds must not be negative")
        if 0 < stall_after < MIN_STALL_AFTER:
            raise ConfigError(
                f"stall_after={stall_after:g} is below {MIN_STALL_AFTER:g} s: the client commits "
                f"offsets every {OFFSET_COMMIT_SECONDS:g} s, so a healthy idle consumer would "
                "look stalled and be rebuilt; use 0 to turn the watchdog off")
        if thread_count is not None and thread_count < 1:
            raise ConfigError("thread_count must be at least 1")
        if not delay_levels or any(b < a for a, b in itertools.pairwise(delay_levels)):
            raise ConfigError("delay_levels must be a non-empty ascending list of seconds")
        self.producer_group = producer_group
        self.send_timeout = send_timeout
        self.compress_level = compress_level
        self.max_body_bytes = max_body_bytes
        self.thread_count = thread_count
        self.ordered_topics = frozenset(ordered_topics)
        self.max_reconsume_times = max_reconsume_times
        self.delay_levels = tuple(float(s) for s in delay_levels)
        self.create_topics = create_topics
        self.topic_queues = topic_queues
        self.extra_properties = tuple(extra_properties)
        self.send_back_patience = send_back_patience
        self.client_log_dir = client_log_dir
        self.client_log_level = client_log_level
        self.stall_after = float(stall_after)
        self.max_rebuilds = max_rebuilds
        self.admin = RocketMQAdmin(self.addr, timeout=admin_timeout)
        self._producer: Any = None
        self._producer_lock = threading.Lock()
        self._known_topics: set[str] = set()
        self._closed = False

    # ----------------------------------------------------------------------------------- sending

    def _get_producer(self) -> Any:
        producer = self._producer
        if producer is not None:
            return producer
        with self._producer_lock:
            if self._closed:
                raise TransportClosed("the RocketMQ transport is closed")
            if self._producer is None:
                client = native.client()
                producer = client.Producer(
                    self.producer_group,
                    timeout=int(self.send_timeout * 1000),
                    compress_level=self.compress_level,
                    max_message_size=self.max_body_bytes,
                )
                producer.set_name_server_address(for_native(self.addr))
                native.set_producer_instance_name(producer, native.new_instance_name("p"))
                native.configure_client_log(producer._handle, kind="Producer",
                                            path=self.client_log_dir,
                                            level=self.client_log_level)
                try:
                    producer.start()
                except Exception as exc:
                    raise translate(exc, f"starting producer {self.producer_group}") from exc
                log.info("producer %s started on %s", self.producer_group, self.addr)
                self._producer = producer
            return self._producer

    def send(self, message: OutgoingMessage) -> SendResult:
        """Send synchronously and return the broker's UNIQ_KEY as `broker_message_id`.

        Raises:
            MessageTooLarge: the wire body is over `max_body_bytes` (nothing sent).
            EmptyBody: the body is empty (nothing sent).
            TransportUnavailable: the name server/broker cannot be reached or timed out.
            TransportClosed: the transport was closed (nothing sent, no message to blame).
            TransportError: a property RocketMQ cannot carry, or another send failure.
        """
        msg_id = message.properties.get(PROP_ID) or (message.keys[0] if message.keys else "-")
        if not message.body:  # the C++ client reports it like an outage
            raise EmptyBody(f"message {msg_id}: the body is empty; RocketMQ refuses empty bodies")
        body, encoded = encode_body(bytes(message.body))
        if len(body) > self.max_body_bytes:
            raise MessageTooLarge(
                f"message {msg_id}: body of {len(body)} bytes on the wire"
                f"{' (base64 of ' + str(len(message.body)) + ')' if encoded else ''} exceeds the "
                f"limit of {self.max_body_bytes}"
            )
        for name, value in message.properties.items():
            check_property(name, value)
        if self.create_topics:
            self.ensure_topic(message.topic)
        client = native.client()
        producer = self._get_producer()
        out = client.Message(message.topic)
        try:
            self._fill(out, message, body, encoded)
            ordered = message.topic in self.ordered_topics
            shard = message.sharding_key or (message.keys[0] if message.keys else None)
            if ordered and shard:
                result = producer.send_orderly_with_sharding_key(out, shard)
            else:
                result = producer.send_sync(out)
        except TransportError:
            raise
        except Exception as exc:
            if "no route info" in str(exc).lower():  # deleted? the next send asks again
                self._known_topics.discard(message.topic)
            log.warning("message %s: send to %s failed: %s", msg_id, message.topic, exc)
            raise translate(exc, f"sending message {msg_id} to {message.topic}") from exc
        finally:
            native.destroy_message(out)
        if int(result.status) != 0:
            # Stored on the master but not flushed/replicated as configured: it is sent.
            log.warning("message %s: broker accepted %s with status %s", msg_id, result.msg_id,
                        getattr(result.status, "name", result.status))
        log.debug("message %s sent to %s as %s", msg_id, message.topic, result.msg_id)
        return SendResult(result.msg_id, None, int(result.offset))

    def _fill(self, out: Any, message: OutgoingMessage, body: bytes, encoded: bool) -> None:
        if message.tags:
            out.set_tags(message.tags)
        if message.keys:
            out.set_keys(" ".join(message.keys))
        others = []
        for name, value in message.properties.items():
            out.set_property(name, value)
            if name not in ENVELOPE_PROPERTIES:
                others.append(name)
        if others:
            out.set_property(PROP_NAMES, ",".join(others))
        if encoded:
            out.set_property(PROP_ENC, ENC_BASE64)
        if message.delay:
            level = delay_level(message.delay, self.delay_levels)
            if message.delay > self.delay_levels[-1]:
                log.warning("message %s: delay of %.0f s exceeds the longest delay level "
                            "(%.0f s); using that", message.properties.get(PROP_ID, "-"),
                            message.delay, self.delay_levels[-1])
            if level:
                out.set_delay_time_level(level)
        out.set_body(body)

    # ------------------------------------------------------------------------------------ topics

    def check(self) -> None:
        """rocketmq-client-python and librocketmq load, and the name servers' host names
        resolve (`resolve`: one that does not would abort the process from a native thread).

        Raises:
            ConfigError: the client or its native library is missing, or a name server's
                host name does not exist.
        """
        native.client()
        try:
            resolved(self.addr)
        except TransportUnavailable as exc:  # DNS away for now: the sends wait it out
            log.warning("%s", exc)

    def ensure_topic(self, topic: str) -> None:
        """Create `topic` if the name server has no route (asked again after a send found none).

        Raises:
            TransportUnavailable: the name server or a broker cannot be reached.
        """
        if topic in self._known_topics:
            return
        if self.admin.topic_route(topic) is None:
            self.admin.create_topic(topic, queues=self.topic_queues,
                                    order=topic in self.ordered_topics)
            log.info("created topic %s with %d queues", topic, self.topic_queues)
        self._known_topics.add(topic)

    def missing_topics(self, topics: list[str]) -> list[str]:
        """Those of `topics` the name server has no route for (none when it cannot say)."""
        try:
            return [t for t in topics if self.admin.topic_route(t) is None]
        except TransportError:
            return []  # the name server's state shows when the consumer starts

    def prepare_group(self, group: str) -> None:
        """Before a consumer of `group` starts: create `%RETRY%group` (else the first
        redelivery waits for the C++ client's next rebalance, ~10 s) and set the group's
        `retryMaxTimes` when `max_reconsume_times` is configured.

        Best effort without `max_reconsume_times` (a cluster may refuse admin requests): a
        failure is logged and the consumer starts anyway.

        Raises:
            TransportError: `max_reconsume_times` is set and the broker refused or is down.
        """
        try:
            self.admin.prepare_group(group, retry_max_times=self.max_reconsume_times)
        except TransportError as exc:
            if self.max_reconsume_times is not None:
                raise
            log.warning("consumer %s: could not prepare the group on the broker: %s", group, exc)

    def dead_letters(self, group: str) -> list[Delivery]:
        """Messages in `%DLQ%group` (read straight from the broker, committing nothing).

        The broker creates DLQ topics write-only; this makes the topic readable first.
        """
        topic = dlq_topic(group)
        if self.admin.topic_route(topic) is None:
            return []
        stored = self.admin.read_topic(topic, group=f"ckit-dlq-reader-{group}")
        return [self._from_stored(m) for m in stored]

    def _from_stored(self, stored: StoredMessage) -> Delivery:
        props = stored.properties
        values = read_properties(lambda n: props.get(n, ""), self.extra_properties)
        return make_delivery(
            topic=props.get("RETRY_TOPIC") or stored.topic,
            body=stored.body,
            broker_message_id=props.get("UNIQ_KEY", ""),
            tags=props.get("TAGS", ""),
            keys=props.get("KEYS", ""),
            properties=values,
            reconsume_times=stored.reconsume_times,
            queue_id=stored.queue_id,
            queue_offset=stored.queue_offset,
            born_timestamp_ms=stored.born_timestamp_ms,
            stored=True,
        )

    # --------------------------------------------------------------------------------- consuming

    def consumer(
        self,
        group: str,
        subscriptions: Sequence[Subscription],
        callback: DeliveryCallback,
        *,
        threads: int = 1,
    ) -> RocketMQConsumer:
        """A PushConsumer of `group` over `subscriptions` with `callback` for every topic."""
        if not group:
            raise ConfigError("consumer group must not be empty")
        if not subscriptions:
            raise ConfigError(f"consumer group {group}: no subscriptions")
        return RocketMQConsumer(self, group, subscriptions, callback,
                                threads=self.thread_count or max(1, threads))

    def close(self) -> None:
        """Shut the producer down (consumers are shut down by their owners). Idempotent."""
        with self._producer_lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.shutdown()
            except Exception:
                log.exception("producer %s: shutdown failed", self.producer_group)
            # not DestroyProducer: it crashes this librocketmq build later (one leak per transport)
