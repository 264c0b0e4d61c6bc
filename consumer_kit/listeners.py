"""Listener registrations: which function handles which topic and tags, and how to call it."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from consumer_kit.core.errors import ConfigError, HandlerSignatureError
from consumer_kit.core.messages import Subscription, tag_matches
from consumer_kit.message import Message

Handler = Callable[..., Any]
DedupeKey = Callable[[Message], str]

LISTENER_OPTIONS = ("tags", "dedupe_key", "permanent")


@dataclasses.dataclass(frozen=True)
class Listener:
    """A handler bound to a topic and tag expression."""

    topic: str
    tags: str
    fn: Handler
    wants_session: bool
    dedupe_key: DedupeKey | None = None
    permanent: tuple[type[BaseException], ...] = ()

    @property
    def name(self) -> str:
        """`module.function`, for logs."""
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"


def wants_session(fn: Handler) -> bool:
    """True for `(msg, session)` handlers, False for `(msg)`; anything else is refused.

    Raises:
        HandlerSignatureError: the function cannot be called as `fn(msg)` or `fn(msg, session)`.
    """
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
    """Finds the listener for a message's topic and tags."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def add(self, listener: Listener) -> None:
        """Register a listener; two listeners may not claim the same topic and tags."""
        for other in self.listeners:
            if other.topic == listener.topic and other.tags == listener.tags:
                raise ConfigError(f"topic {listener.topic!r} tags {listener.tags!r} already has "
                                  f"listener {other.name}")
        self.listeners.append(listener)

    def find(self, topic: str, tags: str) -> Listener | None:
        """The first listener of `topic` whose tag expression matches `tags`."""
        for listener in self.listeners:
            if listener.topic == topic and tag_matches(listener.tags, tags):
                return listener
        return None

    def subscriptions(self) -> list[Subscription]:
        """One subscription per topic, tag expressions merged (`*` wins)."""
        merged: dict[str, set[str]] = {}
        for listener in self.listeners:
            merged.setdefault(listener.topic, set()).update(
                t.strip() for t in listener.tags.split("||"))
        return [Subscription(topic, "*" if "*" in tags else " || ".join(sorted(tags)))
                for topic, tags in merged.items()]
