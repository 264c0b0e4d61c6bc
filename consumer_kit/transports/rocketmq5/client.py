"""Loading rocketmq-python-client 5.x (module `rocketmq.v5`), an optional dependency.

Both RocketMQ Python clients ship a top-level `rocketmq` package with their own
`rocketmq/__init__.py`; 5.x's imports `ClientConfiguration` and friends from it, and the 2.0.0
client's is empty. When 2.0.0 was installed after 5.x (or uninstalled, taking the shared file
with it), the 5.x client cannot import itself: this module says so in one line with the fix.

The client's gRPC channels get a capped reconnect back-off (`RECONNECT_OPTIONS`): it builds
them with fixed options, and gRPC's default back-off (1 s, x1.6 per failed attempt, up to
120 s) left a client that lost its proxy for 10-20 s waiting 5-16 s more after the proxy was
back, for its next attempt. The cap bounds the wait between attempts (a refused connection is
tried again within a second), not how long one attempt may take; it applies to every 5.x
client of the process, from the first `v5()` on.

Received messages keep their KEYS in the sender's order (`keep_received_key_order`): the client
turns the protobuf's ordered `keys` into a set, and the first KEYS entry is a foreign message's
dedupe id.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from consumer_kit.core.errors import ConfigError

log = logging.getLogger(__name__)

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
        _cap_reconnect_backoff()
        keep_received_key_order()
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


#: Versions of rocketmq-python-client whose received-message path `keep_received_key_order`
#: was read against (`Consumer.__handle_receive_message_response`: `Message().fromProtobuf`)
KEY_ORDER_CLIENT_VERSIONS = frozenset({"5.1.2"})
#: The attribute of a received message that holds its KEYS in the sender's order, a tuple (the
#: client's own `keys` is a set)
SENT_KEYS = "ckit_sent_keys"


def keep_received_key_order() -> bool:
    """Make the client's consumer keep each received message's KEYS in the sender's order, as
    `SENT_KEYS`. False, with a warning, when the installed client is not one this was checked
    against: its consumer then hands over the keys as a set, whose order is lost (see
    `wire.received_delivery` for what a foreign message's dedupe id then is).

    The client's `Message.fromProtobuf` copies the protobuf's repeated `keys` (the sender's
    order) into a set. The consumer module's `Message` (it builds every received message with
    it, and nothing else) becomes a subclass that also keeps them as a tuple; the client's own
    class, its producer and everything else are left as they are.
    """
    try:
        version = importlib.metadata.version("rocketmq-python-client")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    try:
        from rocketmq.v5.consumer import consumer as module
        from rocketmq.v5.model import Message
    except ImportError as exc:
        version = f"{version} ({exc})"
    else:
        built = getattr(module, "Message", None)
        if getattr(built, "ckit_keeps_key_order", False):
            return True  # kept already
        if (version in KEY_ORDER_CLIENT_VERSIONS and isinstance(built, type)
                and built is Message and callable(getattr(built, "fromProtobuf", None))):
            module.Message = _key_order_message(built)
            return True
    log.warning("rocketmq5: rocketmq-python-client %s is not one whose received KEYS order "
                "consumer-kit can keep (%s): a message without ckit_id and with several KEYS "
                "dedupes on all of them", version, ", ".join(sorted(KEY_ORDER_CLIENT_VERSIONS)))
    return False


def _key_order_message(base: type) -> type:
    """The client's `Message` that also keeps the protobuf's keys, in order, as `SENT_KEYS`."""

    class KeyOrderMessage(base):
        ckit_keeps_key_order = True

        def fromProtobuf(self, message: Any) -> Any:
            built = super().fromProtobuf(message)
            setattr(self, SENT_KEYS, tuple(message.system_properties.keys))
            return built

    return KeyOrderMessage


def configuration(endpoint: str, request_timeout: float) -> Any:
    """A client configuration for the proxy at `endpoint` without credentials."""
    lib = v5()
    return lib.ClientConfiguration(endpoint, lib.Credentials(),
                                   request_timeout=max(1, round(request_timeout)))


#: gRPC channel options the 5.x client's channels get on top of its own: after a failed
#: connection the next attempt comes within a second (gRPC's defaults: 1 s, x1.6 per failed
#: attempt, up to 120 s)
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 500),
                     ("grpc.max_reconnect_backoff_ms", 1000))


class BackoffCappedAio:
    """`grpc.aio` as the client's channel module sees it, with `RECONNECT_OPTIONS` added to the
    options of every channel it opens (everything else is `grpc.aio` itself)."""

    def __init__(self, aio: Any) -> None:
        self.aio = aio

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aio, name)

    def insecure_channel(self, target: str, options: Any = None, *args: Any,
                         **kwargs: Any) -> Any:
        return self.aio.insecure_channel(target, _with_backoff(options), *args, **kwargs)

    def secure_channel(self, target: str, credentials: Any, options: Any = None, *args: Any,
                       **kwargs: Any) -> Any:
        return self.aio.secure_channel(target, credentials, _with_backoff(options), *args,
                                       **kwargs)


_RECONNECT_NAMES = frozenset(name for name, _ in RECONNECT_OPTIONS)


def _with_backoff(options: Any) -> list[tuple[str, Any]]:
    return [*(o for o in (options or ()) if o[0] not in _RECONNECT_NAMES), *RECONNECT_OPTIONS]


def _cap_reconnect_backoff() -> None:
    """Give the client's channel module `BackoffCappedAio` (once). A client without that module
    (another version than the pinned one) keeps gRPC's back-off, with a warning."""
    try:
        from rocketmq.v5.client.connection import rpc_channel
    except ImportError as exc:
        log.warning("rocketmq5: cannot cap the gRPC reconnect back-off (%s): a restarted proxy "
                    "may be reached only after gRPC's own back-off (up to 120 s)", exc)
        return
    aio = getattr(rpc_channel, "aio", None)
    if aio is None:
        log.warning("rocketmq5: the client's channel module has no `aio`: the gRPC reconnect "
                    "back-off is not capped")
    elif not isinstance(aio, BackoffCappedAio):
        rpc_channel.aio = BackoffCappedAio(aio)
