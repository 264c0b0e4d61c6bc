"""`MultiRelay` used from Python refuses two databases that hold one outbox before any row
moves (`ckit relay` checked this, a library user's `MultiRelay.run` did not), and leaves a
database that does not answer out of the check (real MariaDB: tests/integration/test_shards.py)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import outbox_table
from outbox_producer.distinct import check_distinct_outboxes
from outbox_producer.shards import MultiRelay
from tests.recording import RecordingTransport
from tests.test_cli_scale import producer_db


def test_a_copy_of_a_shard_given_to_a_multi_relay_is_refused_before_any_row_moves(
        tmp_path: Path) -> None:
    # Given a shard with 6 due rows, and a copy of its file given as a second shard
    first = producer_db(tmp_path / "orders_a.db", 6)
    shutil.copy(tmp_path / "orders_a.db", tmp_path / "copy.db")
    transport = RecordingTransport()
    relays = MultiRelay([first, f"sqlite:///{tmp_path / 'copy.db'}"], transport)
    # When they are run
    with pytest.raises(ConfigError, match=r"number 2 .* holds the outbox of .* number 1"):
        relays.run(once=True)
    # Then nothing was sent (each row would have gone out twice)
    assert transport.counts() == {}


def test_distinct_shards_given_to_a_multi_relay_are_each_sent_once(tmp_path: Path) -> None:
    first = producer_db(tmp_path / "orders_a.db", 4)
    second = producer_db(tmp_path / "orders_b.db", 3)
    transport = RecordingTransport()
    total = MultiRelay([first, second], transport).run(once=True)
    assert total.stats.sent == 7 and set(transport.counts().values()) == {1}


def test_a_database_that_does_not_answer_is_left_out_of_the_check_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given one shard that answers and one on a port nothing listens on
    url = producer_db(tmp_path / "orders_a.db", 2)
    engines = [make_engine(url),
               sa.create_engine("mysql+pymysql://u:secret@127.0.0.1:9/none",
                                connect_args={"connect_timeout": 2})]
    table = outbox_table(sa.MetaData())
    # When the check skips what does not answer
    with caplog.at_level(logging.WARNING):
        check_distinct_outboxes(engines, table, skip_unreachable=True)
    # Then it warned once, naming the database without its password
    assert "database number 2" in caplog.text and "does not answer" in caplog.text
    assert "secret" not in caplog.text
    # and without the skip it is the database's own error
    with pytest.raises(sa.exc.OperationalError):
        check_distinct_outboxes(engines, table)
