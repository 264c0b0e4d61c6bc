"""The RocketMQ remoting protocol, one request and one response over TCP: the frame, the
request and response codes the admin client uses, and the JSON quirks of the Java side.

Wire format of one frame: ``int32 length | int32 (serialize type << 24 | header length) | header
JSON | body``; the header carries ``code``, ``opaque``, ``flag`` and string ``extFields``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import socket
import struct
from collections.abc import Mapping
from typing import Any

from consumer_kit.core.errors import TransportError, TransportUnavailable
from consumer_kit.transports.rocketmq.wire import DEFAULT_ADMIN_TIMEOUT

# Request codes (org.apache.rocketmq.common.protocol.RequestCode).
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_AND_CREATE_TOPIC = 17
GET_BROKER_CONFIG = 26
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
VIEW_MESSAGE_BY_ID = 33
GET_CONSUMER_LIST_BY_GROUP = 38
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201

# Response codes (ResponseCode).
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
FLUSH_DISK_TIMEOUT = 10
SLAVE_NOT_AVAILABLE = 11
FLUSH_SLAVE_TIMEOUT = 12
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22

PERM_READ = 4
#: PullSysFlag.FLAG_SUBSCRIPTION: the pull carries its own subscription (no consumer online).
PULL_SUBSCRIPTION_FLAG = 0x4
PERM_WRITE = 2
MASTER_ID = 0

_opaque = itertools.count(1)
#: fastjson writes maps with integer keys unquoted (`{0:"host:port"}`): quote them.
_BARE_INT_KEY = re.compile(r"([{,])\s*(-?\d+)\s*:")



def loads_json(raw: bytes) -> Any:
    """Parse a JSON header or body, quoting fastjson's bare integer map keys."""
    text = raw.decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_INT_KEY.sub(r'\1"\2":', text))


def _split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise TransportError(f"not a host:port address: {addr!r}")
    return host.strip("[]"), int(port)


@dataclasses.dataclass
class Response:
    """One decoded response frame."""

    code: int
    remark: str
    ext: dict[str, str]
    body: bytes


def call(
    addr: str,
    code: int,
    ext: Mapping[str, object] | None = None,
    body: bytes = b"",
    *,
    timeout: float = DEFAULT_ADMIN_TIMEOUT,
) -> Response:
    """Send one request to `addr` (a name server or a broker) and read its response.

    Raises:
        TransportUnavailable: cannot connect, or no answer within `timeout` seconds.
    """
    header = json.dumps({
        "code": code,
        "language": "PYTHON",
        "version": 399,
        "opaque": next(_opaque),
        "flag": 0,
        "serializeTypeCurrentRPC": "JSON",
        "extFields": {k: str(v).lower() if isinstance(v, bool) else str(v)
                      for k, v in (ext or {}).items()},
    }).encode()
    frame = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    try:
        with socket.create_connection(_split_addr(addr), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(frame)
            (length,) = struct.unpack(">I", _recv_exactly(sock, 4))
            payload = _recv_exactly(sock, length)
    except OSError as exc:
        raise TransportUnavailable(f"RocketMQ at {addr} did not answer request {code}: {exc}") \
            from exc
    (mark,) = struct.unpack(">I", payload[:4])
    header_len = mark & 0xFFFFFF
    head = loads_json(payload[4:4 + header_len])
    return Response(
        code=int(head.get("code", -1)),
        remark=str(head.get("remark") or ""),
        ext={str(k): str(v) for k, v in (head.get("extFields") or {}).items()},
        body=payload[4 + header_len:],
    )


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)


def check(response: Response, what: str) -> Response:
    """`response`, or TransportError naming `what` when its code is not SUCCESS."""
    if response.code != SUCCESS:
        raise TransportError(f"{what} failed: code {response.code} {response.remark}".strip())
    return response
