"""consumer-kit: RocketMQ delivery between services, exactly-once in effect.

>>> from consumer_kit import ConsumerApp, Message, Reject, Retry
"""

from __future__ import annotations

from consumer_kit.app import ConsumerApp
from consumer_kit.control import InvalidBody, Reject, Retry
from consumer_kit.errors import CkitError, ConfigError
from consumer_kit.message import Message
from consumer_kit.outcome import Outcome

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

__version__ = "0.1.0"
