"""Harness: the `rocketmq://` transport (rocketmq-client-python 2.0.0, remoting protocol) against
the RocketMQ 5.3.3 name server + broker of scripts/rocketmq5.sh instead of 4.9.7.

Everything else is the 4.9.7 harness: the 5.x test broker has the same eighteen `1s` delay
levels, and topics and groups are created through the same remoting admin client.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import services
from tests.harnesses.rocketmq import RocketMQHarness


@contextmanager
def harness(tmp_path: Path) -> Iterator[RocketMQHarness]:
    services.require("rocketmq5", services.ping_rocketmq5)
    h = RocketMQHarness(services.rocketmq5_namesrv_addr(), tmp_path)
    try:
        yield h
    finally:
        h.transport.close()
