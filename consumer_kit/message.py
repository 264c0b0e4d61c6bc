"""`Message`: what a handler receives, copied out of the transport's object."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from consumer_kit.control import InvalidBody
from consumer_kit.core.envelope import (
    PROP_BIZ,
    PROP_ID,
    PROP_RESEND,
    PROP_SENT,
    PROP_SRC,
    dedupe_id,
    fit_id,
    split_keys,
)
from consumer_kit.core.messages import Delivery

#: The most digits of a Java `long` (`ckit_sent` is epoch ms)
_LONG_DIGITS = 19


@dataclasses.dataclass(frozen=True)
class Message:
    """A received message.

    `id` is the dedupe key: `ckit_id` for outbox messages, else the first KEYS entry, else the
    broker's message id (or what the listener's `dedupe_key` function returned).
    """

    id: str
    topic: str
    tags: str
    keys: tuple[str, ...]
    body: bytes
    properties: Mapping[str, str]
    reconsume_times: int
    broker_message_id: str
    producer: str | None
    #: why the previous attempt failed ("" on a first delivery)
    last_error: str = ""
    #: True when a RECONSUME_LATER now sends the message to the group's dead letters
    last_attempt: bool = False

    @classmethod
    def from_delivery(cls, delivery: Delivery) -> Message:
        """Build a message (dedupe id by the envelope's rules) from a transport delivery."""
        props = dict(delivery.properties)
        return cls(id=dedupe_id(delivery), topic=delivery.topic, tags=delivery.tags,
                   keys=split_keys(delivery.keys), body=delivery.body, properties=props,
                   reconsume_times=delivery.reconsume_times,
                   broker_message_id=delivery.broker_message_id,
                   producer=props.get(PROP_SRC) or None, last_error=delivery.last_error,
                   last_attempt=delivery.last_attempt)

    def with_id(self, dedupe_id: str) -> Message:
        """A copy with another dedupe id (a listener's own `dedupe_key`; a long one is made to
        fit the processed table as `core.envelope.fit_id` says)."""
        return dataclasses.replace(self, id=fit_id(dedupe_id))

    @property
    def is_outbox(self) -> bool:
        """True when the message came through an outbox (it carries `ckit_id`)."""
        return PROP_ID in self.properties

    @property
    def resend(self) -> bool:
        """True for a re-send of an outbox row that went out before (an operator retry, a
        reconciler re-send): the producer waits for a receipt even if we processed it."""
        return self.properties.get(PROP_RESEND) == "1"

    @property
    def biz(self) -> str | None:
        """`biz_type:biz_key` of an outbox message."""
        return self.properties.get(PROP_BIZ)

    @property
    def sent_at_ms(self) -> int | None:
        """Epoch ms when the producer committed the message (a handler may measure its lag);
        None when `ckit_sent` is missing or not a number of ASCII digits a Java `long` holds (a
        foreign producer's junk: `str.isdigit` alone took "²" and 5000 digits, which `int`
        refuses, and the handler raised on every attempt)."""
        raw = self.properties.get(PROP_SENT)
        if not raw or len(raw) > _LONG_DIGITS or not (raw.isascii() and raw.isdigit()):
            return None
        return int(raw)

    def text(self) -> str:
        """The body as UTF-8 text.

        Raises:
            InvalidBody: the body is not UTF-8 (a permanent error: the message is rejected).
        """
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidBody(f"body is not UTF-8: {exc}") from None

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            InvalidBody: the body is not valid JSON, or JSON Python cannot parse (an integer
                over Python's 4300-digit limit, nesting deeper than its recursion limit): a
                permanent error, the message is rejected with the reason (retrying cannot
                help: it used to go to the dead letters after every retry).
        """
        text = self.text()
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidBody(f"body is not valid JSON: {exc}") from None
        except RecursionError:
            raise InvalidBody("body is JSON nested too deep for Python to parse (over its "
                              f"recursion limit, {sys.getrecursionlimit()})") from None
        except ValueError as exc:  # an integer over `sys.get_int_max_str_digits()`
            raise InvalidBody(f"body is JSON Python cannot parse: {exc}") from None
