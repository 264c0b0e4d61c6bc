"""The envelope: the message properties consumer-kit puts on every outbox message, building a
message from an outbox row, and reading the dedupe id back from any delivery.

| property | meaning |
|---|---|
| `ckit_id` | the outbox `message_id`: the dedupe key (also the first RocketMQ KEYS entry) |
| `ckit_biz` | `biz_type:biz_key` |
| `ckit_src` | the producer service: where receipts go |
| `ckit_sent` | epoch ms of the outbox commit (lag metrics) |
| `ckit_resend` | `1` on a re-send (an earlier attempt went out): answer it with a receipt |
| `traceparent` | W3C trace context when tracing is on |

Transports add three of their own and strip them on receive: `ckit_enc` (a base64 body),
`ckit_props` (the names of the other properties, for a 4.x client that cannot list them) and
`ckit_reason` (why the previous attempt failed; surfaces as `Delivery.last_error`). A message
sent by one RocketMQ client and received by the other carries the sender's, so both decode
them (`decode_body`).
See docs/architecture.md, "The envelope".
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from consumer_kit.core.clock import to_epoch_ms
from consumer_kit.core.messages import Delivery, OutgoingMessage
from consumer_kit.core.rows import OutboxRow
from consumer_kit.core.schema.types import MESSAGE_ID_LEN

PROP_ID = "ckit_id"
PROP_BIZ = "ckit_biz"
PROP_SRC = "ckit_src"
PROP_SENT = "ckit_sent"
PROP_RESEND = "ckit_resend"
PROP_TRACEPARENT = "traceparent"
#: Set by transports only: a body that travels base64-encoded.
PROP_ENC = "ckit_enc"
#: `PROP_ENC`'s value for a base64 body.
ENC_BASE64 = "b64"
#: Set by transports only: the names of a message's other properties (the 4.x client can only
#: look properties up by name).
PROP_NAMES = "ckit_props"
#: Set by transports only: why the previous attempt failed (retry copies, dead letters).
PROP_REASON = "ckit_reason"

#: The envelope properties a producer sets (transports read them by name on receive).
ENVELOPE_PROPERTIES = (PROP_ID, PROP_BIZ, PROP_SRC, PROP_SENT, PROP_RESEND, PROP_TRACEPARENT)
#: Property names RocketMQ sets itself (`MessageConst.STRING_HASH_SET`, 4.9.7, plus the
#: transactional ones): a user property of that name is refused or overwritten by the client.
ROCKETMQ_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
    "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
    "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET",
    "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID",
    "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET",
})
#: Property names a RocketMQ 5.3.3 broker keeps for itself (`MessageConst`): a client may not
#: send them (a 5.x broker acts on some, e.g. TIMER_DELAY_SEC delays the message, whichever
#: client sent it), and they are dropped when a stored dead letter is read back.
ROCKETMQ5_PROPERTIES = frozenset({
    "1ST_POP_TIME", "ARRIVE_TIME", "BORN_TIMESTAMP", "BUYER_ID",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "CLUSTER", "CONSUME_START_TIME", "CORRECTION_FLAG",
    "CORRELATION_ID", "DELAY", "DLQ_ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "DUP_INFO",
    "EXTEND_UNIQ_INFO", "INSTANCE_ID", "KEYS", "MAX_OFFSET", "MAX_RECONSUME_TIMES", "MIN_OFFSET",
    "MQ2_FLAG", "MSG_REGION", "MSG_TYPE", "ORIGIN_MESSAGE_ID", "PGROUP", "POP_CK",
    "POP_CK_OFFSET", "PROPERTY_FORWARD_QUEUE_ID", "PUSH_REPLY_TIME", "REAL_QID", "REAL_TOPIC",
    "RECONSUME_TIME", "REDIRECT", "REPLY_TO_CLIENT", "RETRY_TOPIC", "TAGS", "TRACE_CONTEXT",
    "TRACE_ON", "TRANSACTION_CHECK_TIMES", "TRANSFER_FLAG", "TRAN_MSG",
    "TRAN_PREPARED_QUEUE_OFFSET", "TTL", "UNIQ_KEY", "WAIT",
})
#: Prefixes of the names RocketMQ 5 keeps for itself
ROCKETMQ_RESERVED_PREFIXES = ("__", "TIMER_", "INNER_")


def is_rocketmq_property(name: str) -> bool:
    """Whether RocketMQ (4.9.7 or 5.x) keeps the property `name` for itself.

    >>> [is_rocketmq_property(n) for n in ("KEYS", "TIMER_DELAY_SEC", "x")]
    [True, True, False]
    """
    return (name in ROCKETMQ_PROPERTIES or name in ROCKETMQ5_PROPERTIES
            or name.startswith(ROCKETMQ_RESERVED_PREFIXES))


#: Properties no user header may set.
RESERVED_PROPERTIES = (*ENVELOPE_PROPERTIES, PROP_ENC, PROP_REASON)


def decode_body(body: bytes, properties: dict[str, str]) -> bytes:
    """The body a sender gave, from a received one: `ckit_enc=b64` decoded. Removes the
    transport's `ckit_enc` and `ckit_props` from `properties` (in place).

    >>> props = {"ckit_enc": "b64", "ckit_props": "x", "x": "1"}
    >>> decode_body(b"YQBi", props), props
    (b'a\\x00b', {'x': '1'})

    Raises:
        ValueError: marked base64 but not base64 (the message is not acked: it goes back to
            the broker and, after its retries, to the dead-letter queue).
    """
    properties.pop(PROP_NAMES, None)
    encoding = properties.pop(PROP_ENC, "")
    if not encoding:
        return body
    if encoding != ENC_BASE64:
        raise ValueError(f"unknown body encoding {PROP_ENC}={encoding!r} (only {ENC_BASE64})")
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a body marked {PROP_ENC}={ENC_BASE64} is not base64: {exc}") from None


def stored_body(body: bytes, properties: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """`decode_body` for a message read back from the broker's store (a dead letter): one that
    cannot be decoded is shown as it is stored, its `ckit_enc` kept, rather than hiding the
    rest of the dead-letter queue behind an error."""
    decoded = dict(properties)
    try:
        return decode_body(body, decoded), decoded
    except ValueError:
        return body, properties


#: RocketMQ's KEYS separator (`MessageConst.KEY_SEPARATOR`): one space, nothing else
KEY_SEPARATOR = " "


def split_keys(keys: str) -> tuple[str, ...]:
    """The entries of a KEYS string, in order: split on single spaces only, empty entries
    (from doubled, leading or trailing spaces) dropped. A tab, a no-break space or any other
    whitespace is part of a key, as it is for a Java producer (`str.split()` cut
    `order\\t1001` into `order` and `1001`, and `order\\t1002` was taken for its duplicate).

    >>> split_keys(" a  b\\tc ")
    ('a', 'b\\tc')
    """
    return tuple(key for key in keys.split(KEY_SEPARATOR) if key)


def to_message(row: OutboxRow) -> OutgoingMessage:
    """The message the broker sees for an outbox row.

    `ckit_id` is the message id, also the first KEYS entry so operators can query the broker by
    it; `ckit_src` is the row's `created_by` (the producer that published it, where receipts
    go); user headers go first so they can never overwrite the envelope properties.
    """
    headers = row.headers
    properties = ({str(k): str(v) for k, v in headers.items() if k not in RESERVED_PROPERTIES}
                  if headers else {})
    properties[PROP_ID] = row.message_id
    properties[PROP_BIZ] = f"{row.biz_type}:{row.biz_key}"
    properties[PROP_SRC] = row.created_by or ""
    properties[PROP_SENT] = str(to_epoch_ms(row.gmt_create))
    if row.sent_before:
        properties[PROP_RESEND] = "1"
    keys: tuple[str, ...] = (row.message_id,)
    if row.keys:
        keys += tuple(k for k in split_keys(row.keys) if k != row.message_id)
    return OutgoingMessage(
        topic=row.topic,
        body=row.body,
        tags=row.tags or None,
        keys=keys,
        properties=properties,
        sharding_key=row.biz_key,
    )


def dedupe_id(delivery: Delivery) -> str:
    """The id a delivery dedupes on: `ckit_id`, else the first KEYS entry, else the broker's
    message id (UNIQ_KEY, stable across redeliveries of one send but not across a producer's
    own retries). "" when the delivery has none of them.

    When the transport lost the order of several KEYS (`Delivery.keys_in_order` False), the id
    is all of them, sorted and space separated: the same for a re-send with the same KEYS, and
    never one key picked by chance that other messages share (the first in sorted order of
    "order-1001 cust-7" made every later order of customer 7 a duplicate).

    >>> dedupe_id(Delivery("T", b"", "B1", keys="k1 k2"))
    'k1'
    >>> dedupe_id(Delivery("T", b"", "B1", keys="order-1 cust-7", keys_in_order=False))
    'cust-7 order-1'
    """
    keys = split_keys(delivery.keys)
    first = keys[0] if keys else ""
    if len(keys) > 1 and not delivery.keys_in_order:
        first = " ".join(sorted(keys))
    return fit_id(delivery.properties.get(PROP_ID) or first or delivery.broker_message_id)


#: characters of a long id kept as they are; then "~" and the whole id's SHA-1 (40 hex digits)
_KEPT = MESSAGE_ID_LEN - 41


def fit_id(raw: str) -> str:
    """A dedupe id as the processed table holds it (`MESSAGE_ID_LEN` characters at most).

    An id that fits is kept as it is. A longer one (a foreign producer's KEYS, a listener's
    `dedupe_key`) keeps its first 87 characters, then `~` and the SHA-1 of the whole id, so
    two long ids that share their start stay two ids (cut to the column's length, they were
    one, and the second message was acked as a duplicate of the first). Redis and the
    processed row see the same id.

    An id no database can store as it is, one holding a NUL (PostgreSQL's text refuses it)
    or a lone surrogate (not UTF-8), takes the same form, those characters left out of the
    kept part: stored as it came, every write of its processed row failed, and the message
    was retried into the dead-letter queue with no row.

    >>> fit_id("order-1001")
    'order-1001'
    >>> len(fit_id("k" * 200))
    128
    >>> fit_id("a\\x00b")[:4]  # a NUL left out, the SHA-1 of the whole after it
    'ab~4'
    """
    whole = storable(raw)
    if whole and len(raw) <= MESSAGE_ID_LEN:
        return raw
    kept = raw if whole else "".join(ch for ch in raw if storable(ch))
    return f"{kept[:_KEPT]}~{hashlib.sha1(raw.encode('utf-8', 'surrogatepass')).hexdigest()}"


def storable(text: str) -> bool:
    """Whether every database can store `text` as it is: no NUL, valid UTF-8 (no lone
    surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def stored_text(text: str) -> str:
    """`text` as every database can store it: NULs left out, lone surrogates as U+FFFD (for
    the columns that describe a message, not its id: `fit_id`)."""
    if storable(text):
        return text
    return "".join(ch if storable(ch) else "\ufffd" for ch in text if ch != "\x00")
