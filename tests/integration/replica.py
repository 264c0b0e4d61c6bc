"""The real MariaDB replica of scripts/mariadb-replica.sh, as the replica tests drive it.

The replica (127.0.0.1:3307, read only) follows database ckit_replica of its primary. A test
creates its tables on the primary (connected to ckit_replica, so the DDL is in the binary log),
waits until the replica applied everything (`MASTER_GTID_WAIT`), and may stop replication to
make the replica lag: `lagging` always starts it again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata
from tests import services
from tests.conftest import unique_names

CATCH_UP_S = 30


@dataclass
class ReplicaPair:
    """The primary and its read replica, with this test's tables on both."""

    primary: Engine
    replica: Engine
    primary_url: str
    replica_url: str
    names: TableNames

    def caught_up(self) -> None:
        """Wait (bounded) until the replica applied everything the primary logged so far."""
        with self.primary.connect() as conn:
            position = conn.execute(sa.text("SELECT @@gtid_binlog_pos")).scalar()
        with self.replica.connect() as conn:
            waited = conn.execute(sa.text("SELECT MASTER_GTID_WAIT(:p, :t)"),
                                  {"p": position, "t": CATCH_UP_S}).scalar()
        assert waited == 0, f"the replica did not reach {position} within {CATCH_UP_S}s"

    @contextlib.contextmanager
    def lagging(self, what: str = "SQL_THREAD") -> Iterator[None]:
        """Stop replication (`SQL_THREAD`: the replica receives but applies nothing, i.e. it
        lags; `""`: both threads, the replica stops) for the block; start it again after."""
        self._replica_sql(f"STOP SLAVE {what}".strip())
        try:
            yield
        finally:
            self._replica_sql("START SLAVE")

    def _replica_sql(self, statement: str) -> None:
        with self.replica.connect() as conn:
            conn.execute(sa.text(statement))


def replica_pair() -> Iterator[ReplicaPair]:
    """Fixture body: the pair with this test's tables created on the primary and replicated."""
    primary_url, replica_url = services.mysql_primary_url(), services.mysql_replica_url()
    services.require("mariadb primary", lambda: services.ping_mysql(primary_url))
    services.require("mariadb replica", lambda: services.ping_mysql(replica_url))
    primary, replica = make_engine(primary_url), make_engine(replica_url)
    names = unique_names("r")
    metadata = build_metadata(names, include_transport=False)
    metadata.create_all(primary)
    pair = ReplicaPair(primary, replica, primary_url, replica_url, names)
    try:
        pair.caught_up()
        yield pair
    finally:
        with contextlib.suppress(Exception):
            pair._replica_sql("START SLAVE")
        metadata.drop_all(primary)
        primary.dispose()
        replica.dispose()
