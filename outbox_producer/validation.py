"""What `Outbox.publish` checks before it writes: every rule a message must meet to be sent, so
a bad message fails inside the caller's transaction (which can roll back) instead of being
found by the relay later (FAILED after its retries) or dropped on the way.

The rules are RocketMQ's (apache/rocketmq 4.9.7: `TopicValidator`, `Validators.checkTopic`,
`MessageConst`, the broker's `msgContentCheck`; and the 5.x proxy's: no control characters in
tags, keys and properties, no `|` in a tag, at most 128 properties of 16 KiB in all, the 5.x
broker's own property names), applied whatever the transport, so that a producer can move from
the SQL transport to either RocketMQ without surprises. Text that no encoding can carry (a lone
surrogate) is refused everywhere.

Cost, for whoever optimises publish: no check makes a database round trip. Per publish they
are a handful of regex scans over short strings (topic <= 127 characters, tags, keys, header
names and values), a float check of `delay`, and `len(body)`; only a `bytes` body within a
quarter of the size limit is also scanned once (is it NUL-free UTF-8, or will RocketMQ carry it
as base64, a third larger?). The business-key conflict costs nothing extra: it is read by the
SELECT that already follows a failed INSERT.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from consumer_kit.core.envelope import RESERVED_PROPERTIES, is_rocketmq_property
from consumer_kit.core.errors import ConfigError, PayloadError
from consumer_kit.core.receipt import RECEIPT_TOPIC_PREFIX, receipt_topic

#: RocketMQ's longest topic name (`TopicValidator.TOPIC_MAX_LENGTH`).
TOPIC_MAX_LENGTH = 127
#: RocketMQ's topic charset, `^[%|a-zA-Z0-9_-]+$` (`TopicValidator.VALID_CHAR_BIT_MAP`).
_TOPIC = re.compile(r"^[%|A-Za-z0-9_-]+$")
#: Topics RocketMQ keeps for itself (`TopicValidator.SYSTEM_TOPIC_SET`) and prefixes of the
#: topics it derives from group names (`MixAll`: retry, dead-letter and light message queues).
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
})
RESERVED_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%", "%LMQ%", "rmq_sys_", RECEIPT_TOPIC_PREFIX)
#: consumer-kit's own property names start with this (the envelope, and what transports add).
RESERVED_HEADER_PREFIX = "ckit_"
#: The RocketMQ 5 proxy refuses user properties over 16 KiB in all (UTF-8 bytes, names and
#: values); the envelope takes at most about 1 KiB of it. (The 4.x broker's limit, 32767
#: characters of every property, is higher.)
HEADERS_MAX_BYTES = 15 * 1024
#: The proxy's most user properties, 128, less the envelope's and the transports' own
MAX_HEADERS = 120
#: What RocketMQ 5 refuses in tags, keys and properties (C0 and C1 control characters), and
#: lone surrogates, which no encoding can carry
UNSENDABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f,]")
_WHITESPACE = re.compile(r"\s")


def check_producer(producer: object) -> str:
    """The producer name, usable in its receipt topic `ckit-receipt-<producer>`.

    Raises:
        ConfigError: empty, or the receipt topic would break RocketMQ's topic rules.
    """
    if not isinstance(producer, str) or not producer:
        raise ConfigError(f"producer must be a non-empty string, got {producer!r}")
    topic = receipt_topic(producer)
    if not _TOPIC.match(topic) or len(topic) > TOPIC_MAX_LENGTH:
        raise ConfigError(f"producer {producer!r} cannot name its receipt topic {topic!r}: use "
                          f"letters, digits, '_' and '-', at most "
                          f"{TOPIC_MAX_LENGTH - len(RECEIPT_TOPIC_PREFIX)} characters")
    return producer


def check_topic(topic: object) -> None:
    """Refuse a topic RocketMQ would refuse or keeps for itself.

    Raises:
        PayloadError: empty, too long, a character outside `[%|A-Za-z0-9_-]`, a system topic,
            or a reserved prefix (`%RETRY%`, `%DLQ%`, `%LMQ%`, `rmq_sys_`, `ckit-receipt-`).
    """
    if not isinstance(topic, str) or not topic:
        raise PayloadError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise PayloadError(f"topic is {len(topic)} characters; RocketMQ allows at most "
                           f"{TOPIC_MAX_LENGTH}")
    if not _TOPIC.match(topic):
        raise PayloadError(f"topic {topic!r} has characters RocketMQ refuses: use letters, "
                           "digits, '_', '-', '|' and '%' only")
    if topic in SYSTEM_TOPICS:
        raise PayloadError(f"topic {topic!r} is a RocketMQ system topic")
    for prefix in RESERVED_TOPIC_PREFIXES:
        if topic.startswith(prefix):
            raise PayloadError(f"topic {topic!r} starts with the reserved prefix {prefix!r}")


def check_tags(tags: object) -> None:
    """Refuse tags a subscription could not select: `||` separates tags in a subscription
    expression, whitespace around them is trimmed, and RocketMQ's separators cannot travel.

    Raises:
        PayloadError: naming `tags`.
    """
    if tags is None:
        return
    if not isinstance(tags, str) or not tags:
        raise PayloadError(f"tags must be a non-empty string or None, got {tags!r}")
    if "|" in tags:
        raise PayloadError(f"tags {tags!r} contains '|': '||' separates tags in a "
                           "subscription, and RocketMQ 5 refuses '|' in a tag: a message "
                           "carries one tag")
    if tags != tags.strip() or UNSENDABLE.search(tags):
        raise PayloadError(f"tags {tags!r} has leading or trailing whitespace or control "
                           "characters")


def keys_text(keys: Sequence[str] | str | None) -> str | None:
    """The KEYS column: the keys joined by spaces (RocketMQ's KEYS separator), None for none.

    A `str` is one key. A key with whitespace would be stored as several keys, and an empty
    key would vanish: both are refused.

    Raises:
        PayloadError: naming `keys` and the offending key.
    """
    if keys is None:
        return None
    if isinstance(keys, str):
        items: list[object] = [keys]
    elif isinstance(keys, bytes | Mapping) or not isinstance(keys, Iterable):
        raise PayloadError(f"keys must be a string or a list of strings, got {keys!r}")
    else:
        items = list(keys)
    for key in items:
        if not isinstance(key, str) or not key:
            raise PayloadError(f"keys must be non-empty strings, got {key!r}")
        if _WHITESPACE.search(key) or UNSENDABLE.search(key):
            raise PayloadError(f"key {key!r} contains whitespace or control characters (keys "
                               "are stored space-separated): pass several keys as a list")
    return " ".join(str(k) for k in items) or None


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers as the message properties to store.

    Raises:
        PayloadError: not a mapping of strings to strings; a name that is empty, holds
            whitespace, a comma or a control character, collides with the envelope
            (`consumer_kit.core.envelope.RESERVED_PROPERTIES`, any `ckit_` name) or with a
            property RocketMQ sets itself; a value with RocketMQ's separators; or more than
            `HEADERS_MAX_BYTES` in all, more than `MAX_HEADERS`, an empty value.
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise PayloadError(f"headers must be a mapping of strings, got {type(headers).__name__}")
    if len(headers) > MAX_HEADERS:
        raise PayloadError(f"{len(headers)} headers; RocketMQ 5 carries at most {MAX_HEADERS} "
                           "besides the envelope")
    size = 0
    for name, value in headers.items():
        if (not isinstance(name, str) or not name or _CONTROL_OR_SPACE.search(name)
                or UNSENDABLE.search(name)):
            raise PayloadError(f"header name {name!r} must be a non-empty string without "
                               "whitespace, commas or control characters")
        if name in RESERVED_PROPERTIES or name.startswith(RESERVED_HEADER_PREFIX):
            raise PayloadError(f"header {name!r} collides with the envelope (names starting "
                               f"with {RESERVED_HEADER_PREFIX!r} and "
                               f"{', '.join(sorted(RESERVED_PROPERTIES))} are reserved)")
        if is_rocketmq_property(name):
            raise PayloadError(f"header {name!r} is a property RocketMQ keeps for itself (a "
                               "5.x broker acts on some of them: TIMER_DELAY_SEC delays)")
        if not isinstance(value, str):
            raise PayloadError(f"header {name!r} must have a string value, got "
                               f"{type(value).__name__}")
        if not value or UNSENDABLE.search(value):
            raise PayloadError(f"header {name!r} has an empty value or control characters, "
                               "which RocketMQ does not carry (the 4.x client drops an empty "
                               "property; RocketMQ 5 refuses both)")
        size += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    if size > HEADERS_MAX_BYTES:
        raise PayloadError(f"headers take {size} bytes; RocketMQ 5 carries at most "
                           f"{HEADERS_MAX_BYTES} besides the envelope")
    return dict(headers)


def delay_seconds(delay: object, now: dt.datetime) -> float:
    """`delay` (a timedelta or seconds, None for none) in seconds.

    Raises:
        PayloadError: naming `delay`: a wrong type (bool, str ...), negative, NaN, infinite, or
            so long that the due time is past the year 9999.
    """
    if delay is None:
        return 0.0
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise PayloadError(f"delay must be a timedelta or a number of seconds, got "
                           f"{type(delay).__name__} {delay!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise PayloadError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
    try:
        now + dt.timedelta(seconds=seconds)
    except OverflowError:
        raise PayloadError(f"delay {delay!r} puts the due time past the year 9999") from None
    return seconds


def wire_size(body: bytes, limit: int, *, base64_when_binary: bool) -> int:
    """The size the transport checks against `limit`: RocketMQ carries a body that is not
    NUL-free UTF-8 as base64 (4 bytes per 3). The scan is skipped when even base64 would fit.
    """
    size = len(body)
    if not base64_when_binary or size > limit or 4 * ((size + 2) // 3) <= limit:
        return size
    if b"\x00" not in body:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return size
    return 4 * ((size + 2) // 3)


def check_body_size(body: bytes, limit: int, *, base64_when_binary: bool) -> None:
    """Refuse a body the transport would refuse, before it is written.

    Raises:
        PayloadError: the body is empty (RocketMQ's clients refuse it: "the message body is
            empty", reported like an outage by the C++ client), or its (wire) size is over
            `limit`.
    """
    if not body:
        raise PayloadError("payload is empty: RocketMQ refuses empty message bodies")
    size = wire_size(body, limit, base64_when_binary=base64_when_binary)
    if size > limit:
        wire = f" ({size} as base64 on the wire)" if size != len(body) else ""
        raise PayloadError(f"payload of {len(body)} bytes{wire} exceeds the transport's limit "
                           f"of {limit} bytes")
