"""Loading rocketmq-client-python 2.0.0 and its native librocketmq lazily, with one clear error.

The 2.0.0 package is a ctypes wrapper that ships without `librocketmq.so`; importing it without the
library raises ImportError("rocketmq dynamic library not found"). `scripts/librocketmq.sh` puts a
bundled build next to the package. Everything that touches the C object directly (freeing sent
messages, the client's own log files) lives here too.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
from types import ModuleType
from typing import Any

from consumer_kit.core.errors import ConfigError, TransportError

INSTALL_HINT = (
    "librocketmq is not available to rocketmq-client-python ({reason}): run scripts/librocketmq.sh "
    "(or install librocketmq from the rocketmq-client-cpp releases), and make sure "
    "`pip install 'consumer-kit[rocketmq]'` was run"
)

_instances = itertools.count(1)

#: The C++ client's log levels (rocketmq-client-cpp CLogLevel).
LOG_LEVELS = {"fatal": 1, "error": 2, "warn": 3, "info": 4, "debug": 5, "trace": 6}


@functools.lru_cache(maxsize=1)
def client() -> ModuleType:
    """The `rocketmq.client` module, imported on first use.

    Raises:
        ConfigError: the package or its native library is missing (one line, says what to run).
    """
    try:
        from rocketmq import client as rocketmq_client
    except (ImportError, OSError) as exc:
        raise ConfigError(INSTALL_HINT.format(reason=str(exc) or type(exc).__name__)) from None
    return rocketmq_client


def dll() -> Any:
    """The loaded librocketmq (the ctypes CDLL of rocketmq.ffi)."""
    client()
    from rocketmq import ffi

    return ffi.dll


def new_instance_name(kind: str) -> str:
    """A client instance name unique in this process.

    The C++ client keeps one client factory per `ip@instanceName` and refuses a second producer
    (or consumer) of the same group in one factory ("has been created before"), even across
    transports; distinct instance names give each producer and consumer its own factory, which
    also lets two consumers of one group in one process share the queues.
    """
    return f"ckit-{kind}-{os.getpid()}-{next(_instances)}"


def set_producer_instance_name(producer: Any, name: str) -> None:
    """`SetProducerInstanceName` (not wrapped by the 2.0.0 Producer class)."""
    client()
    from rocketmq.exceptions import ffi_check

    ffi_check(dll().SetProducerInstanceName(producer._handle, name.encode()))


def destroy_message(message: Any) -> None:
    """Free the C object of a `rocketmq.client.Message` (2.0.0 has no `__del__` and leaks it).

    Safe after `send_sync` returned or raised: the C++ client copies the message it sends.
    """
    handle = getattr(message, "_handle", None)
    if handle:
        dll().DestroyMessage(handle)
        message._handle = None


def commit_log_offset(handle: Any) -> int:
    """`GetMessageCommitLogOffset` of a received message handle (valid inside the callback
    only): where the broker stores it, which the 2.0.0 `ReceivedMessage` does not expose."""
    return int(dll().GetMessageCommitLogOffset(handle))


#: Where libstdc++'s pre-C++11 ("copy-on-write") `std::string` keeps its length and capacity:
#: in a header just before its characters (`_Rep`: size_t length, size_t capacity, int refcount,
#: padded to 24 bytes on 64-bit). librocketmq 2.0.0 is built with that ABI (its symbols name
#: `std::string` `Ss`); `check_body_layout` proves it on this process's library.
_REP_LENGTH = 3 * ctypes.sizeof(ctypes.c_size_t)
_REP_CAPACITY = 2 * ctypes.sizeof(ctypes.c_size_t)
#: No broker stores a body this large (RocketMQ's `maxMessageSize` is 4 MiB by default).
_MAX_BODY = 1 << 30


@functools.lru_cache(maxsize=1)
def _body_pointer() -> Any:
    """`GetMessageBody` returning the address of the characters (the 2.0.0 wrapper declares it
    `c_char_p`, which copies up to the first NUL byte)."""
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("GetMessageBody", dll()))


def body(handle: Any) -> bytes:
    """The whole body of a received message handle (valid inside the callback only).

    `GetMessageBody` returns the body's `std::string` as a C string: read as one, a body is cut
    at its first NUL byte, silently (a protobuf or binary body of a Java or Go producer). Its
    length is read from the string's header instead.

    Raises:
        TransportError: the length read is not one a string can have (the message is then not
            acked: it goes back to the broker).
    """
    pointer = _body_pointer()(handle)
    if not pointer:
        return b""
    length = ctypes.c_size_t.from_address(pointer - _REP_LENGTH).value
    capacity = ctypes.c_size_t.from_address(pointer - _REP_CAPACITY).value
    if length > capacity or length > _MAX_BODY:
        raise TransportError(f"cannot read a message body: length {length}, capacity "
                             f"{capacity} (librocketmq's std::string layout is not the one read)")
    return ctypes.string_at(pointer, length)


@functools.lru_cache(maxsize=1)
def check_body_layout() -> None:
    """Prove, once per process, that `body` reads this librocketmq's bodies whole: a message
    made here with a body holding NUL and non-UTF-8 bytes must read back the same.

    Raises:
        ConfigError: it does not (a librocketmq built with another C++ string ABI): consuming
            would cut binary bodies, so no consumer starts.
    """
    sample = b"ckit\x00body\xff\x00"
    library = dll()
    message = library.CreateMessage(b"ckit-body-layout-check")
    try:
        library.SetByteMessageBody(message, sample, len(sample))
        try:
            seen = body(message)
        except TransportError:
            seen = b""
    finally:
        library.DestroyMessage(message)
    if seen != sample:
        raise ConfigError("this librocketmq keeps message bodies in a layout consumer-kit cannot "
                          "read whole (bodies with NUL bytes would be cut): run "
                          "scripts/librocketmq.sh for the build consumer-kit is tested with")


def configure_client_log(handle: Any, *, kind: str, path: str | None, level: str | None) -> None:
    """Point the C++ client's own log (default `~/logs/rocketmq-cpp`) and level for one object.

    `kind` is "Producer" or "PushConsumer"; `handle` is the object's `_handle`.
    """
    lib = dll()
    if path:
        os.makedirs(path, exist_ok=True)
        getattr(lib, f"Set{kind}LogPath")(handle, path.encode())
    if level:
        try:
            number = LOG_LEVELS[level.lower()]
        except KeyError:
            raise ConfigError(
                f"unknown RocketMQ client log level {level!r}: use one of {', '.join(LOG_LEVELS)}"
            ) from None
        getattr(lib, f"Set{kind}LogLevel")(handle, number)


def subscribe_one_callback(
    consumer: Any, topics: list[tuple[str, str]], on_message: Any, *, orderly: bool
) -> Any:
    """Subscribe `consumer` (a `rocketmq.client.PushConsumer`) to `(topic, expression)` pairs and
    register `on_message(consumer_handle, message_handle) -> int` once as its only callback.

    The 2.0.0 `PushConsumer.subscribe` wraps each callback in a closure that re-raises exceptions
    out of the ctypes callback (which the C++ client then reads as CONSUME_SUCCESS); going to the
    library directly avoids that wrapper. Returns the ctypes function object: the caller must keep
    a strong reference to it for as long as the consumer runs.
    """
    client()
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import MSG_CALLBACK_FUNC

    lib = dll()
    for topic, expression in topics:
        ffi_check(lib.Subscribe(consumer._handle, topic.encode(), expression.encode()))
    c_callback = MSG_CALLBACK_FUNC(on_message)
    register = lib.RegisterMessageCallbackOrderly if orderly else lib.RegisterMessageCallback
    ffi_check(register(consumer._handle, c_callback))
    consumer._callback_refs.append(c_callback)
    return c_callback


def destroy_push_consumer(consumer: Any) -> None:
    """Free a shut-down PushConsumer's C object (2.0.0 never does)."""
    handle = getattr(consumer, "_handle", None)
    if handle:
        dll().DestroyPushConsumer(handle)
        consumer._handle = None
