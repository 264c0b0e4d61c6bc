"""What travels between consumer-kit and the RocketMQ 5 proxy: the endpoint, properties, delivery
times, received messages as `Delivery`, stored dead letters, and client errors translated into
the consumer-kit error tree. Pure functions; only `translate` looks at the client's classes.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from consumer_kit.core.envelope import (
    PROP_ID,
    PROP_REASON,
    ROCKETMQ5_PROPERTIES,
    ROCKETMQ_RESERVED_PREFIXES,
    decode_body,
    split_keys,
    stored_body,
)
from consumer_kit.core.errors import (
    ConfigError,
    MessageTooLarge,
    TransportError,
    TransportUnavailable,
)
from consumer_kit.core.messages import Delivery
from consumer_kit.core.urls import mask_url
from consumer_kit.transports.rocketmq5.client import SENT_KEYS

DEFAULT_PRODUCER_TIMEOUT = 3.0
#: The proxy refuses bodies over 4 MiB (`maxMessageSize`); the broker counts properties too.
DEFAULT_ROCKETMQ5_MAX_BODY_BYTES = 4 * 1024 * 1024 - 64 * 1024
#: How long a received message stays invisible to the group while the callback runs (production
#: proxies refuse less than 10 s on receive).
DEFAULT_INVISIBLE_SECONDS = 30.0
#: The long poll of one receive; the proxy holds a poll at least 5 s whatever is asked.
DEFAULT_AWAIT_SECONDS = 5.0
#: The proxy's shortest long poll (5.3.3 `grpcClientConsumerMinLongPollingTimeoutMillis`). It
#: raises a shorter one to this, and refuses the receive (40018, ILLEGAL_POLLING_TIME) when the
#: request's deadline (the client's request timeout + await) leaves less than this.
PROXY_MIN_AWAIT_SECONDS = 5.0
#: RECONSUME_LATER back-off in seconds by redelivery, as RocketMQ's retry levels (10 s, 30 s...).
DEFAULT_ROCKETMQ5_RETRY_DELAYS: tuple[float, ...] = (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)
#: Where a dead letter copied by this transport came from (RETRY_TOPIC cannot be set by a client).
PROP_DLQ_TOPIC = "ckit_dlq_topic"
TRANSPORT_PROPERTIES = frozenset({PROP_DLQ_TOPIC})

#: Property names the broker keeps for itself (RocketMQ 5.3.3), and their prefixes
SYSTEM_PROPERTIES = ROCKETMQ5_PROPERTIES
_SYSTEM_PREFIXES = ROCKETMQ_RESERVED_PREFIXES
_ADDR = re.compile(r"^[A-Za-z0-9.\-\[\]]+:\d{1,5}$")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def parse_endpoint(url: str) -> tuple[str, dict[str, str]]:
    """Split `rocketmq5://host:port[;host:port][?namesrv=host:port]` (the scheme is optional)
    into the proxy endpoint list and its options.

    >>> parse_endpoint("rocketmq5://127.0.0.1:8081?namesrv=127.0.0.1:9886")
    ('127.0.0.1:8081', {'namesrv': '127.0.0.1:9886'})

    Raises:
        ConfigError: another scheme, or an entry that is not `host:port`.
    """
    raw = url.strip()
    if "://" in raw:
        scheme = raw.split("://", 1)[0]
        if scheme != "rocketmq5":
            raise ConfigError(f"not a rocketmq5:// URL: {scheme}:// (the proxy's gRPC endpoint "
                              "is rocketmq5://host:port; a name server is rocketmq://host:port)")
        raw = raw.split("://", 1)[1]
    parts = urlsplit("//" + raw)
    netloc = (parts.netloc + parts.path).rstrip("/")
    entries = [e.strip() for e in netloc.split(";") if e.strip()]
    if not entries or not all(_ADDR.match(e) for e in entries):
        raise ConfigError(f"bad RocketMQ 5 proxy address {mask_url(url)!r}: use "
                          "rocketmq5://host:port (the proxy's gRPC port, 8081 by default)")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"namesrv"}
    if unknown:
        raise ConfigError(f"unknown rocketmq5:// option(s) {sorted(unknown)}: only namesrv=")
    return ";".join(entries), options


def check_property(name: str, value: str) -> None:
    """Refuse a user property the proxy would refuse, before anything is sent.

    Raises:
        TransportError: a system name, or control characters in the name or value.
    """
    if not name or _CONTROL.search(name) or _CONTROL.search(value):
        raise TransportError(f"property {name!r}: empty name or control characters (RocketMQ 5 "
                             "refuses them)")
    if is_system_property(name):
        raise TransportError(f"property name {name!r} is reserved by RocketMQ")


def is_system_property(name: str) -> bool:
    return name in SYSTEM_PROPERTIES or name.startswith(_SYSTEM_PREFIXES)


def delivery_seconds(delay: float, now: float | None = None) -> int:
    """The delivery timestamp (epoch seconds: the 5.x Python client's unit) for `delay` seconds
    from `now`, rounded up so a message is never delivered early.

    >>> delivery_seconds(1.0, now=100.2), delivery_seconds(0.5, now=100.0)
    (102, 101)
    """
    now = time.time() if now is None else now
    return math.ceil(now + delay)


def ordered_keys(keys: Iterable[str], ckit_id: str | None) -> str:
    """Keys whose order was lost (a set) as a KEYS string: `ckit_id` (the outbox message id,
    always the first key sent) first, the rest sorted (an order, not the sender's).

    >>> ordered_keys({"b", "M1", "a"}, "M1")
    'M1 a b'
    """
    rest = sorted(k for k in keys if k and k != ckit_id)
    first = [ckit_id] if ckit_id and ckit_id in set(keys) else []
    return " ".join(first + rest)


def received_keys(message: Any, ckit_id: str | None) -> tuple[str, bool]:
    """A received message's KEYS string, and whether it is in the sender's order: the order the
    protobuf carried (`SENT_KEYS`, kept by `client.keep_received_key_order`), else (a client
    that could not be hooked) `ordered_keys` of the client's set, which is in order only with
    fewer than two keys.

    >>> from types import SimpleNamespace as M
    >>> received_keys(M(keys={"cust-7", "order-1"}, ckit_sent_keys=("order-1", "cust-7")), None)
    ('order-1 cust-7', True)
    >>> received_keys(M(keys={"order-1", "cust-7"}), None)
    ('cust-7 order-1', False)
    """
    sent = getattr(message, SENT_KEYS, None)
    if isinstance(sent, tuple):
        return " ".join(k for k in sent if k), True
    keys = tuple(message.keys or ())
    return ordered_keys(keys, ckit_id), len(keys) < 2


def received_delivery(message: Any, *, reason: str, max_reconsume_times: int | None,
                      decode: bool = True) -> Delivery:
    """Copy a received 5.x `Message` into a `Delivery`, the broker's system properties
    dropped (see `is_system_property`). `reason` is the one this process kept
    for the previous RECONSUME_LATER of that message (the broker cannot carry it). A body a
    `rocketmq://` sender base64-encoded is decoded (`decode_body`), unless not `decode`: the
    body as it travelled (its dead letter).

    Raises:
        ValueError: a body marked base64 that is not (when `decode`).
    """
    # the broker's own properties (a FIFO message's `__SHARDINGKEY`, say) are dropped: the
    # handler sees what the sender set, and a copy of them (the dead letter, a forward) can be
    # sent again: RocketMQ refuses a send that sets a reserved name
    properties = {k: v for k, v in (message.properties or {}).items()
                  if not is_system_property(k) and k not in TRANSPORT_PROPERTIES}
    body = bytes(message.body or b"")
    if decode:
        body = decode_body(body, properties)
    reason = properties.pop(PROP_REASON, "") or reason
    attempt = int(message.delivery_attempt or 1)
    keys, in_order = received_keys(message, properties.get(PROP_ID))
    return Delivery(
        topic=message.topic,
        body=body,
        broker_message_id=message.message_id,
        tags=message.tag or "",
        keys=keys,
        keys_in_order=in_order,
        properties=properties,
        reconsume_times=max(0, attempt - 1),
        born_timestamp_ms=int(message.born_timestamp or 0),
        last_error=reason,
        max_reconsume_times=max_reconsume_times,
    )


def stored_delivery(topic: str, body: bytes, properties: Mapping[str, str], *,
                    reconsume_times: int, queue_id: int, queue_offset: int,
                    born_timestamp_ms: int) -> Delivery:
    """A dead letter read from the broker's store as a `Delivery`: system properties dropped,
    the origin topic restored, the RECONSUME_LATER reason as `last_error`, a base64 body of a
    `rocketmq://` sender decoded (one that is not base64 is kept as it is, with its
    `ckit_enc`: an operator reading dead letters sees what is stored)."""
    user = {k: v for k, v in properties.items()
            if not is_system_property(k) and k not in TRANSPORT_PROPERTIES}
    body, user = stored_body(body, user)
    reason = user.pop(PROP_REASON, "")
    origin = properties.get(PROP_DLQ_TOPIC) or properties.get("RETRY_TOPIC") or topic
    return Delivery(
        topic=origin, body=body, broker_message_id=properties.get("UNIQ_KEY", ""),
        tags=properties.get("TAGS", ""), keys=" ".join(split_keys(properties.get("KEYS", ""))),
        properties=user, reconsume_times=reconsume_times, queue_id=queue_id,
        queue_offset=queue_offset, born_timestamp_ms=born_timestamp_ms, last_error=reason,
    )


def translate(exc: BaseException, what: str) -> TransportError:
    """Map a 5.x client exception to the consumer-kit error tree (one line: what failed, why)."""
    from consumer_kit.transports.rocketmq5.client import v5

    errors = v5().errors
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, errors.PayloadTooLargeException) or "exceeds the threshold" in text:
        return MessageTooLarge(f"{what}: {text}")
    if isinstance(exc, errors.IllegalArgumentException) and "message type not match" in text:
        return TransportError(f"{what}: {explain_type_mismatch(text)}")
    if isinstance(exc, errors.ProxyTimeoutException | errors.TooManyRequestsException |
                  errors.InternalErrorException | TimeoutError | ConnectionError):
        return TransportUnavailable(f"{what}: {text}")
    if isinstance(exc, errors.ClientException):
        return TransportError(f"{what}: {text}")
    if isinstance(exc, ValueError | TypeError):  # this message cannot be encoded (a lone
        # surrogate in a property, say): never an outage, which would hold every other row
        return TransportError(f"{what}: {type(exc).__name__}: {text}")
    return TransportUnavailable(f"{what}: {type(exc).__name__}: {text}")


#: The proxy's longest message group (`maxMessageGroupSize`)
MESSAGE_GROUP_MAX = 64


def message_group(key: str) -> str:
    """A FIFO message group for `key`: the key itself up to `MESSAGE_GROUP_MAX` characters,
    else its first 47, `~` and 16 hex digits of its SHA-1 (the same key, the same group: order
    per key is kept).

    >>> message_group("order-1"), len(message_group("k" * 100))
    ('order-1', 64)
    """
    if len(key) <= MESSAGE_GROUP_MAX:
        return key
    return f"{key[:47]}~{hashlib.sha1(key.encode('utf-8')).hexdigest()[:16]}"


def route_hint(exc: BaseException) -> str:
    """A client exception as a short text for a log line."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def explain_type_mismatch(text: str) -> str:
    """The client's type-mismatch message, with what to do about it."""
    match = re.search(r"topic:(\S+), message_type:(\w+), queue access type:(\w+)", text)
    if not match:
        return text
    topic, sent, accepts = match.groups()
    hints = {
        ("DELAY", "NORMAL"): "a delayed send needs a DELAY topic (or MIXED, which the broker "
                             "allows with enableMixedMessageType=true)",
        ("FIFO", "NORMAL"): "ordered sends (message groups) need a FIFO topic: do not list a "
                            "NORMAL topic in ordered_topics",
        ("NORMAL", "FIFO"): "a FIFO topic takes ordered sends only: list it in ordered_topics",
        ("DELAY", "FIFO"): "a FIFO topic cannot take delayed sends",
    }
    hint = hints.get((sent, accepts), f"the topic accepts {accepts} messages only")
    return f"topic {topic} is {accepts} and refuses a {sent} message: {hint}"
