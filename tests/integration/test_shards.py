"""Sharded outboxes on MariaDB: three producer databases (ckit_shard1..3) served by one relay
process. Reconciling them in one run: tests/reconcile/test_scale_out.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError
from outbox_producer.shards import MultiRelay
from tests.integration.shards import Shards, shards
from tests.recording import RecordingTransport

pytestmark = pytest.mark.mariadb


@pytest.fixture(name="shards")
def shards_fixture() -> Iterator[Shards]:
    yield from shards()


def closed_port_url(url: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return sa.engine.make_url(url).set(port=port).render_as_string(hide_password=False)


def test_one_relay_process_sends_every_shard_once_and_a_shard_down_waits_alone(
        shards: Shards) -> None:
    # Given 40, 30 and 20 due rows in three shard databases, and a fourth shard that is down
    ids = [shards.publish(i, range(n)) for i, n in enumerate((40, 30, 20))]
    transport = RecordingTransport()
    relays = MultiRelay([*shards.urls, closed_port_url(shards.urls[0])], transport,
                        table=shards.names.outbox, batch=15, once_outage_limit=1.0)
    # When one relay process drains them
    total = relays.run(once=True)
    # Then every row of every live shard went out once, each shard counted on its own
    assert transport.counts() == {m: 1 for shard in ids for m in shard}
    assert [r.stats.sent for r in relays.results] == [40, 30, 20, 0]
    assert total.stats.sent == 90
    # and only the shard that is down gave up
    assert [r.gave_up is not None for r in relays.results] == [False, False, False, True]


def test_one_shard_named_twice_in_two_spellings_is_refused_before_any_row_moves(
        shards: Shards) -> None:
    # Given a shard with due rows, named a second time with its default port left out
    shards.publish(0, range(10))
    assert ":3306/" in shards.urls[0]
    again = shards.urls[0].replace(":3306/", "/")
    transport = RecordingTransport()
    relays = MultiRelay([shards.urls[0], again], transport, table=shards.names.outbox)
    # When the relays are run from Python (not through `ckit relay`)
    with pytest.raises(ConfigError, match="holds the outbox of"):
        relays.run(once=True)
    # Then they were refused, and nothing was sent
    assert transport.counts() == {}
