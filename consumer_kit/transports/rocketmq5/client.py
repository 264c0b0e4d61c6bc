"""Loading rocketmq-python-client 5.x (module `rocketmq.v5`), an optional dependency.

Both RocketMQ Python clients ship a top-level `rocketmq` package with their own
`rocketmq/__init__.py`; 5.x's imports `ClientConfiguration` and friends from it, and the 2.0.0
client's is empty. When 2.0.0 was installed after 5.x (or uninstalled, taking the shared file
with it), the 5.x client cannot import itself: this module says so in one line with the fix.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from consumer_kit.core.errors import ConfigError

INSTALL = "pip install 'consumer-kit[rocketmq5]' (rocketmq-python-client==5.1.2)"
REPAIR = "pip install --force-reinstall --no-deps rocketmq-python-client==5.1.2"

_lock = threading.Lock()


@functools.cache
def v5() -> SimpleNamespace:
    """The 5.x client's classes, imported once.

    Raises:
        ConfigError: the client is not installed, or its `rocketmq/__init__.py` was replaced by
            rocketmq-client-python's (the message gives the command that repairs it).
    """
    with _lock:
        try:
            import rocketmq
        except ImportError as exc:
            raise ConfigError(f"the rocketmq5:// transport needs {INSTALL}: {exc}") from None
        if not hasattr(rocketmq, "ClientConfiguration"):
            raise ConfigError(
                "rocketmq-python-client cannot import itself: its rocketmq/__init__.py was "
                "replaced or removed by rocketmq-client-python (both ship a top-level `rocketmq` "
                f"package); run: {REPAIR}")
        try:
            from rocketmq.v5.client import ClientConfiguration, Credentials
            from rocketmq.v5.consumer import SimpleConsumer
            from rocketmq.v5.exception import client_exception
            from rocketmq.v5.model import FilterExpression, Message
            from rocketmq.v5.producer import Producer
        except ImportError as exc:
            raise ConfigError(f"the rocketmq5:// transport needs {INSTALL}: {exc}") from None
    return SimpleNamespace(
        ClientConfiguration=ClientConfiguration, Credentials=Credentials,
        SimpleConsumer=SimpleConsumer, FilterExpression=FilterExpression, Message=Message,
        Producer=Producer, errors=client_exception, OrderedKeysMessage=_ordered_keys(Message),
    )


def _ordered_keys(base: type) -> type:
    """A `Message` that sends its keys in the order given: the client keeps keys in a set and
    iterates it when it builds the request, so `ckit_id` would not stay the first key."""

    class OrderedKeysMessage(base):
        def __init__(self, keys: Iterable[str] = ()) -> None:
            super().__init__()
            self._ckit_keys = tuple(keys)

        @property
        def keys(self) -> tuple[str, ...]:
            return self._ckit_keys

    return OrderedKeysMessage


def configuration(endpoint: str, request_timeout: float) -> Any:
    """A client configuration for the proxy at `endpoint` without credentials."""
    lib = v5()
    return lib.ClientConfiguration(endpoint, lib.Credentials(),
                                   request_timeout=max(1, round(request_timeout)))
