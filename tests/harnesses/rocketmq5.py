"""Harness: the `rocketmq5://` transport (rocketmq-python-client 5.x over gRPC) against the
RocketMQ 5.3.3 proxy of scripts/rocketmq5.sh.

Topics are created MIXED (the conformance suite sends delayed and immediate messages to one
topic; the test broker has `enableMixedMessageType=true`), and each group gets
`retryMaxTimes = MAX_RECONSUME` and its `%DLQ%` topic, all through the name server. A
RECONSUME_LATER asks for a 1 s invisible time; the broker's revive of that takes ~5 s more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from consumer_kit.testing.harness import MAX_RECONSUME, unique, wait_for_dead_letters
from consumer_kit.transports import Delivery
from consumer_kit.transports.rocketmq5 import RocketMQ5Transport
from tests import services

#: Fast settings for tests: 1 s back-off, a 5 s invisible time (the test proxy allows it; a
#: production proxy refuses less than 10 s on receive).
FAST_OPTIONS = {"retry_delays": (1.0,), "invisible_seconds": 5.0}


def transport(**options: object) -> RocketMQ5Transport:
    """A transport on the test proxy with the name server and the fast settings."""
    return RocketMQ5Transport(f"rocketmq5://{services.rocketmq5_proxy_addr()}",
                              namesrv=services.rocketmq5_namesrv_addr(),
                              **{**FAST_OPTIONS, **options})  # type: ignore[arg-type]


class RocketMQ5Harness:
    timeout = 45.0
    quiet = 2.0

    def __init__(self) -> None:
        self.transport = transport()
        assert self.transport.admin is not None
        self.admin = self.transport.admin

    def topic(self, stem: str) -> str:
        name = unique(stem)
        self.admin.create_typed_topic(name, message_type="MIXED", queues=4)
        return name

    def group(self, stem: str) -> str:
        name = unique(stem)
        self.admin.update_group(name, retry_max_times=MAX_RECONSUME)
        self.admin.prepare_dead_letters(name)
        return name

    def dead_letters(self, group: str, *, expect: int) -> list[Delivery]:
        return wait_for_dead_letters(lambda: self.transport.dead_letters(group), expect=expect,
                                     timeout=self.timeout, interval=0.25)


@contextmanager
def harness(tmp_path: Path) -> Iterator[RocketMQ5Harness]:
    services.require("rocketmq5", services.ping_rocketmq5)
    h = RocketMQ5Harness()
    try:
        yield h
    finally:
        h.transport.close()
