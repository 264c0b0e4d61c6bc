"""What travels on the wire for the RocketMQ transport: addresses, delay levels, body encoding,
properties, and the translation of client errors. Pure functions: only `translate` loads the
client (for its exception classes).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from typing import Any

from consumer_kit.core.envelope import (
    PROP_BIZ,
    PROP_ENC,
    PROP_ID,
    PROP_NAMES,
    PROP_REASON,
    PROP_SENT,
    PROP_SRC,
    PROP_TRACEPARENT,
    ROCKETMQ_PROPERTIES,
    decode_body,
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
from consumer_kit.transports.base import DEFAULT_DELAY_LEVELS
from consumer_kit.transports.rocketmq import native

DEFAULT_PRODUCER_GROUP = "ckit-producer"
DEFAULT_SEND_TIMEOUT = 3.0
DEFAULT_ADMIN_TIMEOUT = 5.0
DEFAULT_TOPIC_QUEUES = 4
#: Seconds topic creation waits for the name server to route the new topic.
ROUTE_WAIT = 10.0
DEFAULT_CLIENT_LOG_LEVEL = "warn"
#: The broker refuses messages over 4 MiB (`maxMessageSize`, body plus headers and properties);
#: the C++ client's own default is 128 KiB, so the producer is configured with this limit.
DEFAULT_ROCKETMQ_MAX_BODY_BYTES = 4 * 1024 * 1024 - 64 * 1024
ENVELOPE_PROPERTIES = (PROP_ID, PROP_BIZ, PROP_SRC, PROP_SENT, PROP_TRACEPARENT)
#: Properties the broker or the client set (every one RocketMQ 4.9.7 and 5.x reserve), and the
#: transport's own: a sender may not use them.
RESERVED_PROPERTIES = ROCKETMQ_PROPERTIES | {PROP_ENC, PROP_NAMES}
_ADDR = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
_FORBIDDEN_IN_PROPERTY = re.compile("[\x00\x01\x02]")


def parse_addr(addr: str) -> str:
    """Validate a name-server address list (`host:port` or `host:port;host:port`).

    >>> parse_addr("127.0.0.1:9876/")
    '127.0.0.1:9876'

    Raises:
        ConfigError: an entry is not `host:port`.
    """
    entries = [a.strip() for a in addr.strip().rstrip("/").split(";") if a.strip()]
    if not entries or not all(_ADDR.match(a) for a in entries):
        # (the address comes without its scheme: mask it as the URL it was, user:password@...)
        shown = mask_url(f"rocketmq://{addr}").removeprefix("rocketmq://")
        raise ConfigError(f"bad RocketMQ name-server address {shown!r}: use "
                          "rocketmq://host:port (several: host:port;host:port)")
    return ";".join(entries)


def delay_level(seconds: float, levels: Sequence[float] = DEFAULT_DELAY_LEVELS) -> int:
    """The RocketMQ delay level (1-based) for `seconds`: the first level at or above it; delays
    longer than the last level use the last level. 0 means no delay.

    >>> delay_level(0), delay_level(1), delay_level(2), delay_level(45), delay_level(10**6)
    (0, 1, 2, 5, 18)
    """
    if seconds <= 0:
        return 0
    for index, level_seconds in enumerate(levels, start=1):
        if level_seconds >= seconds - 1e-9:
            return index
    return len(levels)


def encode_body(body: bytes) -> tuple[bytes, bool]:
    """The wire body and whether it was base64-encoded (bodies that are not NUL-free UTF-8).

    >>> encode_body(b"ok"), encode_body(b"a\\x00b")
    ((b'ok', False), (b'YQBi', True))
    """
    if b"\x00" not in body:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return body, False
    return base64.b64encode(body), True


def check_property(name: str, value: str) -> None:
    if not name or _FORBIDDEN_IN_PROPERTY.search(name) or _FORBIDDEN_IN_PROPERTY.search(value):
        raise TransportError(f"property {name!r} has a name or value RocketMQ cannot carry "
                             "(empty name, or NUL/\\x01/\\x02 characters)")
    if name in RESERVED_PROPERTIES or " " in name or "," in name:
        raise TransportError(f"property name {name!r} is reserved or malformed for RocketMQ")


def translate(exc: Exception, what: str) -> TransportError:
    """Map a rocketmq-client exception to the consumer-kit error hierarchy."""
    text = f"{type(exc).__name__}: {exc}".strip()
    lowered = text.lower()
    if "too large" in lowered or ("exceed" in lowered and "size" in lowered):
        return MessageTooLarge(f"{what}: {text}")
    native.client()
    from rocketmq.exceptions import ProducerException

    if isinstance(exc, ProducerException) or "connect" in lowered or "timeout" in lowered:
        # The C++ client reports unreachable name servers/brokers, timeouts and missing routes
        # as send/start failures: all of them are worth a retry later.
        return TransportUnavailable(f"{what}: {text}")
    return TransportError(f"{what}: {text}")


def read_properties(lookup: Callable[[str], str], extra: Sequence[str] = (), *,
                    reason: bool = True) -> dict[str, str]:
    """The non-empty properties of a received message whose names can be known: the envelope,
    `ckit_enc`, `ckit_reason` (unless `reason` is false: a first delivery has none, and each
    lookup is a call into the C library), `extra`, and the names its sender listed in
    `ckit_props` (the 2.0.0 client can only look properties up by name: `lookup(name)` returns
    a value, `""` when missing).

    >>> props = {"ckit_id": "1", "ckit_props": "x", "x": "2", "y": "3", "traceparent": ""}
    >>> read_properties(lambda name: props.get(name, ""))
    {'ckit_id': '1', 'x': '2'}
    """
    names = [*ENVELOPE_PROPERTIES, PROP_ENC, *extra]
    if reason:
        names.append(PROP_REASON)
    listed = lookup(PROP_NAMES)
    if listed:
        names += [n for n in listed.split(",") if n]
    return {name: value for name in names if (value := lookup(name))}


def make_delivery(*, body: bytes, properties: dict[str, str], stored: bool = False,
                  **fields: Any) -> Delivery:
    """A `Delivery` with the transport's own properties removed (`ckit_reason` becomes
    `last_error`) and a base64 body decoded: `decode_body` for a received message (which raises
    on a body marked base64 that is not), `stored_body` for one read back from the store."""
    if stored:
        body, properties = stored_body(body, properties)
    else:
        body = decode_body(body, properties)
    last_error = properties.pop(PROP_REASON, "")
    return Delivery(body=body, properties=properties, last_error=last_error, **fields)


def received_delivery(msg: Any, body: bytes, *, extra: Sequence[str],
                      max_reconsume_times: int | None, stored: bool = False) -> Delivery:
    """A `Delivery` from a received 2.0.0 `ReceivedMessage` and its whole body
    (`native.body`); `stored`: the body as it travelled, not decoded (`make_delivery`).

    Raises:
        ValueError: a body marked base64 that is not (unless `stored`).
    """
    reconsume_times = int(msg.reconsume_times)
    values = read_properties(lambda name: text(msg.get_property(name)), extra,
                             reason=reconsume_times > 0)
    return make_delivery(
        topic=text(msg.topic), body=body, broker_message_id=text(msg.id), tags=text(msg.tags),
        keys=text(msg.keys), properties=values, reconsume_times=reconsume_times,
        queue_id=int(msg.queue_id), queue_offset=int(msg.queue_offset),
        born_timestamp_ms=int(msg.born_timestamp), max_reconsume_times=max_reconsume_times,
        stored=stored)


def text(value: bytes | str | None) -> str:
    """What the client returned (bytes, `b''` when missing) as text."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
