"""The relay's Prometheus gauges, as a scrape of the process sees them."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import build_metadata
from outbox_producer import Outbox
from outbox_producer.metrics import database_label
from outbox_producer.shards import MultiRelay
from tests.conftest import unique_names
from tests.recording import RecordingTransport


def test_a_relay_serving_two_databases_publishes_the_backlog_of_each(tmp_path: Path) -> None:
    # Given two producer databases, one with 3 due rows and one with 1
    names = unique_names()
    urls = [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
    engines = [make_engine(url) for url in urls]
    for engine, rows in zip(engines, (3, 1)):
        build_metadata(names, include_transport=False).create_all(engine)
        outbox = Outbox(engine, producer="orders", table=names.outbox)
        with engine.begin() as conn:
            for i in range(rows):
                outbox.publish(conn, "T", {"i": i}, biz_type="t", biz_key=str(i))
    # When one relay process serves both and refreshes its gauges
    relays = MultiRelay(urls, RecordingTransport(), table=names.outbox)
    for relay in relays.relays:
        relay._refresh_metrics()
    # Then each database's backlog is a series of its own: the second did not overwrite the
    # first (a scrape showed only whichever database was read last)
    labels = [database_label(engine) for engine in engines]
    assert labels[0] != labels[1]
    for label, due in zip(labels, (3, 1)):
        assert REGISTRY.get_sample_value(
            "ckit_outbox_backlog", {"database": label, "state": "PENDING"}) == due
        assert REGISTRY.get_sample_value(
            "ckit_outbox_oldest_unacked_seconds", {"database": label}) == 0
    # and no series without a database claims a value no relay measured (a `ckit consume`
    # or `ckit receipts` process, which imports these metrics, showed "0 s unacked")
    assert REGISTRY.get_sample_value("ckit_outbox_oldest_unacked_seconds") is None
    for engine in engines:
        engine.dispose()
