"""The end-to-end tests of `rocketmq://` (rocketmq-client-python 2.0.0 over the remoting
protocol) against the RocketMQ 5.3.3 name server and broker of scripts/rocketmq5.sh.

The tests are those of test_rocketmq_e2e.py, collected here once more with the name-server
address pointed at 5.x. Dead-lettering works because the transport sends failed messages back
itself: the old C++ client's own send-back to the DLQ makes a 5.x broker throw a
NullPointerException, and that librocketmq build drops a message whose send-back failed
(docs/rocketmq5.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import services
from tests.consumer.conftest import Env, _env
from tests.integration.test_rocketmq_e2e import (  # noqa: F401 - collected again here
    World,
    test_a_consumer_killed_mid_handler_leaves_the_message_to_be_applied_once,
    test_a_handler_failing_twice_succeeds_on_the_third_delivery_via_the_retry_topic,
    test_a_message_failing_every_time_ends_in_the_dead_letter_queue_with_its_reason,
    test_a_rejected_message_is_acked_once_and_its_row_becomes_rejected,
    test_outbox_to_consumed_through_rocketmq_and_ckit_acks,
    test_the_same_ckit_id_sent_twice_is_applied_once,
    world,
)

pytestmark = [pytest.mark.rocketmq5, pytest.mark.slow]


@pytest.fixture(params=["sqlite", pytest.param("mariadb", marks=[pytest.mark.mariadb,
                                                                 pytest.mark.redis])])
def env(request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    services.require("rocketmq5", services.ping_rocketmq5)
    # World and `ckit acks` read the name server from here: point them at 5.x.
    monkeypatch.setattr(services, "rocketmq_addr", services.rocketmq5_namesrv_addr)
    yield from _env(request.param, tmp_path)
