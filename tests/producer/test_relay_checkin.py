"""The relay's transactions go back to the pool without the pool's reset ROLLBACK once they have
committed (`consumer_kit.core.checkin.begin`): on MariaDB, PyMySQL would send one after every
claim, mark and release, for nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from consumer_kit.core.db import make_engine
from outbox_producer import Relay
from tests.conftest import Db
from tests.consumer.test_checkin import check_ins, server_rollbacks
from tests.producer.test_relay import publish_many
from tests.recording import RecordingTransport


@pytest.mark.mariadb
@pytest.mark.parametrize("claim", ["lease", "lock"])
def test_a_relay_run_sends_no_rollback_after_its_commits_on_mariadb(mariadb: Db,
                                                                    claim: str) -> None:
    # Given: 25 due rows and a relay on a pool of two MariaDB connections
    ids = publish_many(mariadb, 25)
    engine = make_engine(mariadb.url, pool_size=2, max_overflow=0)
    transport = RecordingTransport()
    relay = Relay(engine, transport, table=mariadb.names.outbox, batch=10, claim=claim)
    ended: list[object] = []  # transactions a `Connection` rolled back itself
    sa.event.listen(engine, "rollback", ended.append)
    try:
        before = server_rollbacks(engine)
        resets, start = check_ins(engine), len(ended)
        # When: it drains them in three batches (and one claim that finds none)
        result = relay.run_once()
        reads = len(ended) - start
        after = server_rollbacks(engine)
        # Then: every row went out once; no check-in reset a connection (each claim, mark
        # and release committed first); the server ran no ROLLBACK but the ends of the run's
        # reads (its clock check, its backlog gauge) and the first count's two check-ins
        assert result.stats.sent == 25 and transport.counts() == {mid: 1 for mid in ids}
        assert resets and False not in resets
        assert after - before == 2 + reads
    finally:
        engine.dispose()
