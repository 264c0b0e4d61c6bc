"""consumer-kit: RocketMQ delivery between services, exactly-once in effect.

>>> from consumer_kit import ConsumerApp, Message, Reject, Retry

The names below load on first use, so `import consumer_kit.core` (or the producer half, which
builds on it) does not load the consumer half, Redis or the consumer metrics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from consumer_kit.app import ConsumerApp
    from consumer_kit.control import InvalidBody, Reject, Retry
    from consumer_kit.core.errors import CkitError, ConfigError
    from consumer_kit.message import Message
    from consumer_kit.outcome import Outcome

_EXPORTS = {
    "CkitError": "consumer_kit.core.errors",
    "ConfigError": "consumer_kit.core.errors",
    "ConsumerApp": "consumer_kit.app",
    "InvalidBody": "consumer_kit.control",
    "Message": "consumer_kit.message",
    "Outcome": "consumer_kit.outcome",
    "Reject": "consumer_kit.control",
    "Retry": "consumer_kit.control",
}

__all__ = [
    "CkitError",
    "ConfigError",
    "ConsumerApp",
    "InvalidBody",
    "Message",
    "Outcome",
    "Reject",
    "Retry",
]

__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'consumer_kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
