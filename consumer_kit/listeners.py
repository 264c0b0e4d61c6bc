"""Listener registrations: which function handles which topic and tags, and how to call it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import math
from collections.abc import Callable
from typing import Any

from consumer_kit.core.errors import ConfigError, HandlerSignatureError
from consumer_kit.core.messages import Subscription, tag_matches
from consumer_kit.message import Message

Handler = Callable[..., Any]
DedupeKey = Callable[[Message], str | int]

LISTENER_OPTIONS = ("tags", "dedupe_key", "permanent", "timeout")
#: A handler still running after this long is reported, rolled back and redelivered.
DEFAULT_TIMEOUT = dt.timedelta(seconds=60)


@dataclasses.dataclass(frozen=True)
class Listener:
    """A handler bound to a topic and tag expression."""

    topic: str
    tags: str
    fn: Handler
    wants_session: bool
    dedupe_key: DedupeKey | None = None
    permanent: tuple[type[BaseException], ...] = ()
    timeout: float = DEFAULT_TIMEOUT.total_seconds()

    @property
    def name(self) -> str:
        """`module.function`, for logs."""
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"


def wants_session(fn: Handler) -> bool:
    """True for `(msg, session)` handlers, False for `(msg)`; anything else is refused.

    Raises:
        HandlerSignatureError: the function cannot be called as `fn(msg)` or `fn(msg, session)`.
    """
    if _is_async(fn):
        raise HandlerSignatureError(
            f"listener {getattr(fn, '__qualname__', fn)} is async: async handlers are not "
            "supported yet (its coroutine would never run); write it as a plain function")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise HandlerSignatureError(f"{fn!r} is not a function a listener can call") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_kw = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if required_kw or not positional or len(positional) > 2 or any(
        p.default is not p.empty for p in positional
    ):
        shown = f"{getattr(fn, '__qualname__', fn)}{inspect.signature(fn)}"
        raise HandlerSignatureError(
            f"listener {shown} must take (msg) or (msg, session) positional parameters"
        )
    return len(positional) == 2


def _is_async(fn: Handler) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own __call__
    return (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            or (not inspect.isfunction(fn) and call is not None
                and (inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call))))


def parse_timeout(value: object) -> float:
    """A listener `timeout=` (a timedelta or seconds) as positive seconds.

    Raises:
        ConfigError: not a positive, finite duration.
    """
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if (not isinstance(seconds, int | float) or isinstance(seconds, bool)
            or not math.isfinite(seconds) or seconds <= 0):
        raise ConfigError(f"listener timeout must be a positive duration, not {value!r}")
    return float(seconds)


def exception_types(value: object, option: str) -> tuple[type[BaseException], ...]:
    """`permanent=` / `permanent_errors=`: exception classes (one, or several in a tuple or
    list).

    Raises:
        ConfigError: anything else (a name as text would break every failing message later).
    """
    items = (value,) if isinstance(value, type) else value
    if isinstance(items, str | bytes) or not isinstance(items, tuple | list | set | frozenset):
        raise ConfigError(f"{option} must be exception classes, not {value!r}")
    bad = [v for v in items if not (isinstance(v, type) and issubclass(v, BaseException))]
    if bad:
        raise ConfigError(f"{option} must be exception classes, not {bad[0]!r}")
    return tuple(items)


def check_listener_values(tags: object, dedupe_key: object) -> None:
    """Refuse a listener's `tags` that is not text, or that mixes `*` with tags or names none
    (`"a || *"`, `" || "`), and a `dedupe_key` that is not a function, at decoration time (a
    wrong one would reject every message without a `ckit_id`).

    Raises:
        ConfigError: naming the option.
    """
    if not isinstance(tags, str):
        raise ConfigError(f"listener tags must be a RocketMQ tag expression (text), not {tags!r}")
    parts = [part.strip() for part in tags.split("||")]
    if tags.strip() not in ("", "*") and ("*" in parts or not any(parts)):
        # the subscription took such an expression for "*" while the router matched it tag by
        # tag: the messages of every other tag were delivered, found no listener, rejected
        raise ConfigError(f"listener tags {tags!r} must be '*' alone (every tag) or tags "
                          "joined by '||', e.g. 'created || paid'")
    if dedupe_key is not None and not callable(dedupe_key):
        raise ConfigError(f"dedupe_key must be a function of the message (or None), not "
                          f"{dedupe_key!r}: e.g. dedupe_key=lambda m: m.keys[0]")


def topic_from_name(fn: Handler) -> str:
    """The topic of a bare `@app.listener`: the function name upper-cased
    (`order_created` -> `ORDER_CREATED`)."""
    return str(getattr(fn, "__name__", "")).upper()


def check_options(options: dict[str, Any]) -> None:
    """Refuse unknown listener options at decoration time."""
    unknown = sorted(set(options) - set(LISTENER_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown listener option(s) {', '.join(unknown)}; "
                          f"valid: {', '.join(LISTENER_OPTIONS)}")


class Router:
    """Finds the listener for a message's topic and tags.

    A listener naming tags (`"created"`, `"a || b"`) wins over a `"*"` listener of the same topic
    whatever the order they were registered in, so every listener can be reached; two listeners
    claiming the same tag of a topic are refused.
    """

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def add(self, listener: Listener) -> None:
        """Register a listener.

        Raises:
            ConfigError: an empty topic, or a topic and tag another listener already has.
        """
        if not listener.topic or not listener.topic.strip():
            raise ConfigError(f"listener {listener.name} has an empty topic")
        mine = _tags(listener.tags)
        for other in self.listeners:
            if other.topic != listener.topic:
                continue
            theirs = _tags(other.tags)
            shared = mine & theirs
            if shared:
                raise ConfigError(
                    f"topic {listener.topic!r} tag(s) {', '.join(sorted(shared))} already has "
                    f"listener {other.name}; {listener.name} could never receive them")
        self.listeners.append(listener)

    def find(self, topic: str, tags: str) -> Listener | None:
        """The listener of `topic` naming `tags`, else its `"*"` listener."""
        fallback = None
        for listener in self.listeners:
            if listener.topic != topic:
                continue
            if listener.tags.strip() == "*":
                fallback = listener
            elif tag_matches(listener.tags, tags):
                return listener
        return fallback

    def subscriptions(self) -> list[Subscription]:
        """One subscription per topic, tag expressions merged (`*` wins)."""
        merged: dict[str, set[str]] = {}
        for listener in self.listeners:
            merged.setdefault(listener.topic, set()).update(_tags(listener.tags))
        return [Subscription(topic, "*" if "*" in tags else " || ".join(sorted(tags)))
                for topic, tags in merged.items()]


def _tags(expression: str) -> set[str]:
    return {t.strip() for t in (expression or "*").split("||") if t.strip()} or {"*"}
