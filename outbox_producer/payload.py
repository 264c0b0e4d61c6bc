"""Turning a user payload into body bytes, before anything is written."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import uuid
from typing import Any

from consumer_kit.core.errors import PayloadError


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serializable")


#: one encoder for every payload (json.dumps with options builds a new one per call)
_ENCODER = json.JSONEncoder(default=_default, ensure_ascii=False, separators=(",", ":"),
                            allow_nan=False)


def encode_payload(payload: Any) -> bytes:
    """Return the body bytes for a payload.

    dict, list, dataclass and other JSON values become compact UTF-8 JSON; `str` is sent as its
    UTF-8 bytes; `bytes` are sent as they are. Binary bodies are stored as they are: each
    transport keeps them intact on the wire (the RocketMQ transport base64-encodes bodies the
    C++ client would truncate and marks them `ckit_enc=b64`).

    Raises:
        PayloadError: the payload cannot be serialized (the message names the type).

    >>> encode_payload({"order": 1})
    b'{"order":1}'
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    try:
        text = _ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not serializable: {exc}") from None
    return text.encode("utf-8")
