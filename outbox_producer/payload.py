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
        fields = dataclasses.asdict(value)
        _check_keys(fields)  # its dicts, as any payload's (the encoder calls this for it)
        return fields
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serializable")


#: what `_check_keys` looks into (a tuple of types: `isinstance` takes it faster than a union)
_CONTAINERS = (dict, list, tuple)

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
    try:
        if isinstance(payload, str):
            return payload.encode("utf-8")
        if isinstance(payload, _CONTAINERS):
            _check_keys(payload)
        return _ENCODER.encode(payload).encode("utf-8")
    except PayloadError:
        raise
    except UnicodeEncodeError as exc:
        raise PayloadError(f"payload has text no encoding can carry (a lone surrogate at "
                           f"{exc.start}): {exc.reason}") from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not serializable: {exc}") from None


def _check_keys(value: Any) -> None:
    """Refuse dict keys that become one key in JSON (`{1: "a", "1": "b"}`: JSON keys are text,
    and the reader keeps the last), in `value` (a dict, list or tuple) and the dicts, lists and
    tuples in it (a dataclass's are checked as the encoder meets it: `_default`). Keys that are
    already text cost one pass over them.

    Raises:
        PayloadError: naming the key.
    """
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            seen: set[str] = set()
            for key in value:
                text = _json_key(key)
                if text in seen:
                    raise PayloadError(f"payload keys collide once made JSON text: {key!r} "
                                       f"is {text!r}, which another key is too")
                seen.add(text)
        for item in value.values():
            if isinstance(item, _CONTAINERS):
                _check_keys(item)
    else:
        for item in value:
            if isinstance(item, _CONTAINERS):
                _check_keys(item)


def _json_key(key: Any) -> str:
    """The text JSON makes of a dict key (`json.dumps({key: 0})`)."""
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    return json.dumps(key)
