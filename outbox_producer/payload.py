"""Turning a user payload into body bytes, before anything is written."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import json
import uuid
from typing import Any

from outbox_producer.errors import PayloadError

ENC_B64 = "b64"


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serializable")


def encode_payload(payload: Any) -> tuple[bytes, str | None]:
    """Return `(body, encoding)` for a payload.

    dict, list, dataclass and other JSON values become UTF-8 JSON; `str` is sent as its UTF-8
    bytes; `bytes` are sent as they are when they are NUL-free UTF-8, else base64 with
    encoding `b64` (the RocketMQ C++ client truncates bodies at NUL bytes).

    Raises:
        PayloadError: the payload cannot be serialized (the message names the type).

    >>> encode_payload({"order": 1})
    (b'{"order":1}', None)
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        raw = bytes(payload)
        if _is_plain_text(raw):
            return raw, None
        return base64.b64encode(raw), ENC_B64
    if isinstance(payload, str):
        return payload.encode("utf-8"), None
    try:
        text = json.dumps(payload, default=_default, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not serializable: {exc}") from None
    return text.encode("utf-8"), None


def decode_body(body: bytes, encoding: str | None) -> bytes:
    """Undo `encode_payload`'s transfer encoding (base64 for binary bodies)."""
    if encoding == ENC_B64:
        return base64.b64decode(body)
    return body


def _is_plain_text(raw: bytes) -> bool:
    if b"\x00" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
