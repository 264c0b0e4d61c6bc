"""The RocketMQ 4.x stored-message format (the broker's `MessageDecoder`), as pull and view
responses carry it, and the property string both directions use.

One stored message: ``totalSize | magic | bodyCRC | queueId | flag | queueOffset |
physicalOffset | sysFlag | bornTimestamp | bornHost | storeTimestamp | storeHost |
reconsumeTimes | preparedTransactionOffset | bodyLength body | topicLength topic |
propertiesLength properties`` (big-endian; hosts are 4-byte IPv4 + port, or 16 bytes + port when
the sysFlag says IPv6). Properties are ``name \\x01 value`` pairs separated by ``\\x02``.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import zlib
from collections.abc import Iterator, Mapping

from consumer_kit.core.errors import TransportError

_MESSAGE_MAGIC = {0xAABBCCDD, 0xDAA320A7}  # 4.x message magic codes (v1, blank)
SYSFLAG_COMPRESSED = 0x1
_SYSFLAG_BORNHOST_V6 = 0x1 << 4
_SYSFLAG_STOREHOST_V6 = 0x1 << 5
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
_HEAD = ">iIiiiqqiq"  # totalSize .. bornTimestamp


@dataclasses.dataclass(frozen=True)
class StoredMessage:
    """A message as the broker stores it (decoded from a pull or view response).

    `body` is decompressed; `compressed` says whether it was stored compressed.
    `commit_log_offset` and `store_host` (`ip:port`) say where it is stored.
    """

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    reconsume_times: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    flag: int = 0
    compressed: bool = False
    commit_log_offset: int = -1
    store_host: str = ""
    offset_msg_id: str = ""


def decode_messages(data: bytes) -> Iterator[StoredMessage]:
    """Decode the concatenated messages of a pull response (MessageDecoder.decodes)."""
    pos = 0
    while pos + 4 <= len(data):
        (total,) = struct.unpack_from(">i", data, pos)
        yield decode_message(data[pos:pos + total])
        pos += total


def decode_message(buf: bytes) -> StoredMessage:
    """Decode one stored message (a view-by-offset response is exactly one).

    Raises:
        TransportError: not a 4.x message.
    """
    (_total, magic, _crc, queue_id, flag, queue_offset, physical_offset, sysflag,
     born_ts) = struct.unpack_from(_HEAD, buf, 0)
    if magic not in _MESSAGE_MAGIC:
        raise TransportError(f"unknown message magic code {magic:#x}")
    pos = struct.calcsize(_HEAD)
    pos += 20 if sysflag & _SYSFLAG_BORNHOST_V6 else 8
    (store_ts,) = struct.unpack_from(">q", buf, pos)
    pos += 8
    host_len = 16 if sysflag & _SYSFLAG_STOREHOST_V6 else 4
    store_ip = buf[pos:pos + host_len]
    (store_port,) = struct.unpack_from(">i", buf, pos + host_len)
    pos += host_len + 4
    (reconsume_times, _prepared, body_len) = struct.unpack_from(">iqi", buf, pos)
    pos += struct.calcsize(">iqi")
    body = buf[pos:pos + body_len]
    pos += body_len
    compressed = bool(sysflag & SYSFLAG_COMPRESSED)
    if compressed:
        body = zlib.decompress(body)
    topic_len = buf[pos]
    pos += 1
    topic = buf[pos:pos + topic_len].decode("utf-8")
    pos += topic_len
    (props_len,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    props = decode_properties(buf[pos:pos + props_len].decode("utf-8"))
    family = socket.AF_INET6 if host_len == 16 else socket.AF_INET
    return StoredMessage(
        topic, bytes(body), props, queue_id, queue_offset, reconsume_times, born_ts, store_ts,
        flag=flag, compressed=compressed, commit_log_offset=physical_offset,
        store_host=f"{socket.inet_ntop(family, store_ip)}:{store_port}",
        offset_msg_id=offset_msg_id(store_ip, store_port, physical_offset),
    )


def offset_msg_id(ip: bytes, port: int, commit_log_offset: int) -> str:
    """The broker's message id of a stored message (MessageDecoder.createMessageId): store host
    address, port and commit log offset in hex. (The C++ client writes the IPv4 bytes of its own
    variant reversed; only its last 16 characters, the offset, match.)

    >>> offset_msg_id(bytes([127, 0, 0, 1]), 10911, 255)
    '7F00000100002A9F00000000000000FF'
    """
    return (ip + struct.pack(">iq", port, commit_log_offset)).hex().upper()


def decode_properties(text: str) -> dict[str, str]:
    """`name\\x01value\\x02...` as a dict (MessageDecoder.string2messageProperties)."""
    props: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            props[name] = value
    return props


def encode_properties(properties: Mapping[str, str]) -> str:
    """The property string of a send (MessageDecoder.messageProperties2String).

    >>> encode_properties({"KEYS": "k1", "x": "1"}) == "KEYS\\x01k1\\x02x\\x011"
    True

    Raises:
        TransportError: a name or value holds a separator character (or NUL).
    """
    for name, value in properties.items():
        if not name or any(c in name + value for c in "\x00\x01\x02"):
            raise TransportError(f"property {name!r} holds a character RocketMQ cannot carry")
    return PROPERTY_SEPARATOR.join(f"{n}{NAME_VALUE_SEPARATOR}{v}"
                                   for n, v in properties.items())
