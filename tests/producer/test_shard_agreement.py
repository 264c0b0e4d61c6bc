"""Relays of one outbox started with `--shard i/N` of different N: the rows of some `MOD(id, N)`
are claimed by none of them (0/2 and 1/3 leave ids 3, 5, 9, 11 ... PENDING forever, every
relay exiting 0). A sharded relay announces its N on the database while it runs and refuses,
before any row moves, to start beside a running relay of another N (real MariaDB and
PostgreSQL)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from outbox_producer import Relay, Shard
from tests.conftest import Db
from tests.producer.test_relay import publish_many
from tests.recording import RecordingTransport


def states(db: Db) -> dict[int, int]:
    table = outbox_table(sa.MetaData(), db.names.outbox)
    with db.engine.connect() as conn:
        return {int(i): int(s) for i, s in conn.execute(sa.select(table.c.id, table.c.state))}


def running(relay: Relay) -> threading.Thread:
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    return thread


def test_a_relay_of_another_shard_count_than_a_running_peer_is_refused_before_any_row_moves(
        server_db: Db) -> None:
    # Given 12 due rows and a relay of --shard 0/2 running (it sent its 6)
    publish_many(server_db, 12)
    peer = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
                 shard=Shard(0, 2), idle_sleep=0.1)
    thread = running(peer)
    try:
        deadline = time.monotonic() + 10
        while sum(s == OutboxState.SENT for s in states(server_db).values()) < 6:
            assert time.monotonic() < deadline, states(server_db)
            time.sleep(0.05)
        # When a relay of --shard 1/3 starts beside it
        transport = RecordingTransport()
        mismatched = Relay(server_db.engine, transport, table=server_db.names.outbox,
                           shard=Shard(1, 3))
        # Then it is refused with one line naming both shard specs and the session holding
        # the peer's lock (a pooler or a dead host may keep it: the line says how to end it),
        # and sent nothing
        with pytest.raises(ConfigError, match=r"--shard 1/3 .* --shard 0/2") as refused:
            mismatched.run_once()
        assert ("pg_terminate_backend(" if server_db.kind == "postgresql" else "KILL ") in str(
            refused.value), refused.value
        assert transport.sent == []
        # while a peer of the same N is welcome: it sends the other 6
        same = RecordingTransport()
        Relay(server_db.engine, same, table=server_db.names.outbox,
              shard=Shard(1, 2)).run_once()
        assert len(same.sent) == 6
    finally:
        peer.stop()
        thread.join(10)
    assert set(states(server_db).values()) == {int(OutboxState.SENT)}


def test_the_shard_count_may_change_once_the_relays_of_the_old_one_stopped(
        server_db: Db) -> None:
    publish_many(server_db, 6)
    Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
          shard=Shard(0, 2)).run_once()
    transport = RecordingTransport()
    for index in range(3):
        Relay(server_db.engine, transport, table=server_db.names.outbox,
              shard=Shard(index, 3)).run_once()
    assert set(states(server_db).values()) == {int(OutboxState.SENT)}


def test_a_relay_of_a_shard_a_peer_also_runs_announces_it_once_that_peer_stopped(
        server_db: Db) -> None:
    # Given two relays of --shard 0/2 running (on MariaDB the second finds the name taken)
    publish_many(server_db, 4)
    first, second = (Relay(server_db.engine, RecordingTransport(),
                           table=server_db.names.outbox, shard=Shard(0, 2), idle_sleep=0.1)
                     for _ in range(2))
    threads = [running(first)]
    time.sleep(0.3)
    threads.append(running(second))
    time.sleep(0.3)
    try:
        # When the first stops, and the second's next metrics refresh announces again
        first.stop()
        threads[0].join(10)
        second.shards.ensure()
        # Then a relay of another N is still refused: the second 0/2 runs
        with pytest.raises(ConfigError, match=r"runs with --shard 0/2"):
            Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
                  shard=Shard(1, 3)).run_once()
    finally:
        second.stop()
        threads[1].join(10)


def test_a_relay_whose_announcement_was_cut_off_announces_again(server_db: Db) -> None:
    # Given a relay of --shard 0/2 announced, and its announcing session killed (a restart,
    # a proxy's timeout)
    relay = Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
                  shard=Shard(0, 2))
    relay.shards.ensure()
    held = relay.shards._conn
    assert held is not None
    postgres = server_db.kind == "postgresql"
    session = held.exec_driver_sql(
        "SELECT pg_backend_pid()" if postgres else "SELECT CONNECTION_ID()").scalar()
    held.rollback()
    with server_db.engine.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(session)})" if postgres
                             else f"KILL CONNECTION {int(session)}")
        conn.commit()
    try:
        # When its next metrics refresh checks the announcement
        relay.shards.ensure()
        # Then it holds it again: a relay of another N is refused
        with pytest.raises(ConfigError, match=r"runs with --shard 0/2"):
            Relay(server_db.engine, RecordingTransport(), table=server_db.names.outbox,
                  shard=Shard(1, 3)).run_once()
    finally:
        relay.shards.release()


def test_a_sharded_relay_on_an_engine_of_one_pooled_connection_still_drains(
        server_db: Db) -> None:
    # Given a caller's engine with one pooled connection (and a short wait for it)
    publish_many(server_db, 6)
    engine = sa.create_engine(server_db.url, pool_size=1, max_overflow=0, pool_timeout=2)
    transport = RecordingTransport()
    try:
        # When a sharded relay (whose announcement holds a connection all run) drains on it
        result = Relay(engine, transport, table=server_db.names.outbox,
                       shard=Shard(0, 1)).run(once=True)
    finally:
        engine.dispose()
    # Then every row went out: the announcement's connection is not one of the caller's pool
    assert len(transport.sent) == 6 and result.stats.sent == 6


@pytest.mark.postgresql
def test_outboxes_of_one_name_in_two_schemas_are_two_outboxes(tmp_path: Path) -> None:
    # Given two services on one PostgreSQL database, each with its own schema (search_path)
    # holding its own ckit_outbox
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.schema import build_metadata
    from tests.conftest import database_url, unique_names

    names = unique_names("sa")
    schemas = [f"{names.outbox}_a", f"{names.outbox}_b"]
    base = make_engine(database_url("postgresql", tmp_path))
    with base.begin() as conn:
        for schema in schemas:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engines = [make_engine(f"{base.url.render_as_string(hide_password=False)}"
                           f"?options=-csearch_path%3D{schema}") for schema in schemas]
    try:
        for engine in engines:
            build_metadata(names, include_transport=False).create_all(engine)
        a = Relay(engines[0], RecordingTransport(), table=names.outbox, shard=Shard(0, 2),
                  idle_sleep=0.1)
        thread = running(a)
        time.sleep(0.3)
        # When service B starts a relay of another shard count on its own outbox
        # Then it runs: the two tables only share a name (it was refused as A's peer)
        try:
            Relay(engines[1], RecordingTransport(), table=names.outbox,
                  shard=Shard(0, 4)).run_once()
        finally:
            a.stop()
            thread.join(10)
    finally:
        for engine in engines:
            engine.dispose()
        with base.begin() as conn:
            for schema in schemas:
                conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        base.dispose()
