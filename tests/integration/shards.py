"""Three producer databases on MariaDB (ckit_shard1..3, a sharded outbox) and consumer groups
whose processed tables live in two other databases (inventory in ckit_test, billing in
ckit_test2), with this test's tables created in each."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

import sqlalchemy as sa

from consumer_kit.core.clock import utcnow
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import TableNames, build_metadata, outbox_table, processed_table
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox, Relay
from tests import services
from tests.conftest import unique_names
from tests.recording import RecordingTransport


@dataclass
class Shards:
    """The shard databases and the groups' databases of one test."""

    urls: list[str]
    engines: list[sa.Engine]
    names: TableNames
    groups: dict[str, tuple[str, sa.Engine]]  # group -> (url, engine) of its processed table

    def publish(self, shard: int, keys: range) -> list[str]:
        outbox = Outbox(self.engines[shard], producer="orders", table=self.names.outbox)
        with self.engines[shard].begin() as conn:
            return [outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=f"{shard}-{k}")
                    for k in keys]

    def states(self, shard: int) -> dict[str, OutboxState]:
        t = outbox_table(sa.MetaData(), self.names.outbox)
        with self.engines[shard].connect() as conn:
            return {m: OutboxState(s)
                    for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}

    def processed(self, group: str, message_id: str, status: str, at: dt.datetime) -> None:
        _, engine = self.groups[group]
        p = processed_table(sa.MetaData(), self.names.processed)
        with engine.begin() as conn:
            conn.execute(sa.insert(p).values(consumer_group=group, message_id=message_id,
                                             topic="T", status=status, attempts=1,
                                             first_seen_at=at, processed_at=at))

    def stuck_in_every_shard(self) -> list[list[str]]:
        """In each shard four messages SENT an hour ago: consumed by both groups (receipts
        lost), by inventory only, rejected by billing, by nobody; and one orphan processed
        row. Returns each shard's message ids."""
        old = utcnow() - dt.timedelta(hours=1)
        per_shard = []
        t = outbox_table(sa.MetaData(), self.names.outbox)
        for shard in range(len(self.urls)):
            ids = self.publish(shard, range(4))
            Relay(self.engines[shard], RecordingTransport(), table=self.names.outbox).run_once()
            with self.engines[shard].begin() as conn:  # made and sent before they were processed
                conn.execute(sa.update(t).values(sent_at=old,
                                                 gmt_create=old - dt.timedelta(minutes=1))
                             .execution_options(ckit_transition="test-setup"))
            self.processed("inventory", ids[0], "SUCCEEDED", old)
            self.processed("billing", ids[0], "SUCCEEDED", old)
            self.processed("inventory", ids[1], "SUCCEEDED", old)
            self.processed("billing", ids[2], "FAILED", old)
            per_shard.append(ids)
        self.processed("inventory", "01ORPHAN0000000000000000000", "SUCCEEDED", old)
        return per_shard


def shards() -> Iterator[Shards]:
    """Fixture body: the three shards and the two group databases, with this test's tables."""
    urls = services.mysql_shard_urls()
    for url in urls:
        services.require("mariadb shard", lambda url=url: services.ping_mysql(url))  # type: ignore[misc]
    group_urls = {"inventory": services.mysql_url(), "billing": services.mysql_url2()}
    names = unique_names("s")
    metadata = build_metadata(names, include_transport=False)
    engines = [make_engine(url) for url in urls]
    groups = {g: (url, make_engine(url)) for g, url in group_urls.items()}
    everything = [*engines, *(e for _, e in groups.values())]
    for engine in everything:
        metadata.create_all(engine)
    try:
        yield Shards(urls, engines, names, groups)
    finally:
        for engine in everything:
            metadata.drop_all(engine)
            engine.dispose()
