"""Ids and keys that differ only by trailing spaces are different on MariaDB too.

MariaDB's `utf8mb4_bin` (and MySQL 8's) pads trailing spaces: under it "E-1" and "E-1 " were
one processed row (the second message acked as a duplicate without running) and biz keys "k"
and "k " one outbox row, while Redis keeps them apart. Tables are made in the server's NO PAD
binary collation (`consumer_kit.core.schema.types.mysql_collation`), and `ckit db init
--upgrade` converts a table made before."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import pytest
import sqlalchemy as sa

from consumer_kit import Message
from consumer_kit.core.db import check_tables
from consumer_kit.core.ddl import init_db, render_ddl, schema_metadata, split_statements
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.schema.check import padding_tables
from consumer_kit.transports import ConsumeStatus
from tests.conftest import Db
from tests.consumer.conftest import Env, add_reservation, delivery

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


def _id_collations(db: Db, table: str) -> set[str]:
    with db.engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT DISTINCT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA "
            "= DATABASE() AND TABLE_NAME = :t AND DATA_TYPE = 'varchar'"), {"t": table}
        ).scalars())


def _two_entries(env: Env) -> list[ConsumeStatus]:
    """Deliver two messages whose dedupe keys are "E-1" and "E-1 "; their statuses. (The
    effect is written bracketed: the test's own stock table pads.)"""
    app = env.app()

    @app.listener("ORDER_CREATED", dedupe_key=lambda m: m.properties["entry"])
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, f"[{msg.properties['entry']}]")

    statuses = []
    for entry in ("E-1", "E-1 "):
        message = delivery(None, src=None)  # a foreign message: its listener's key counts
        message.properties["entry"] = entry
        statuses.append(app.process(message).status)
    return statuses


@pytest.fixture
def mariadb_env(tmp_path: Any) -> Any:
    from tests.consumer.conftest import _env
    yield from _env("mariadb", tmp_path)


def test_dedupe_keys_that_differ_only_by_a_trailing_space_each_get_their_effect(
        mariadb_env: Env) -> None:
    env = mariadb_env
    # Given a listener whose dedupe key is a property, on tables `db init` would make
    # When two messages come with the keys "E-1" and "E-1 "
    statuses = _two_entries(env)
    # Then both ran once, and each has its processed row
    assert statuses == [ConsumeStatus.CONSUME_SUCCESS] * 2
    assert env.effects() == {"[E-1]": 1, "[E-1 ]": 1}
    assert [m for m, _, _ in env.processed()] == ["E-1", "E-1 "]


def test_ckit_ids_that_differ_only_by_a_trailing_space_are_two_messages(
        mariadb_env: Env) -> None:
    env = mariadb_env
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        add_reservation(env, session, f"[{msg.id}]")

    # When two messages come with ckit_id "X-1" and "X-1 "
    for ckit_id in ("X-1", "X-1 "):
        assert app.process(delivery(ckit_id)).status is ConsumeStatus.CONSUME_SUCCESS
    # Then each had its effect
    assert env.effects() == {"[X-1]": 1, "[X-1 ]": 1}


def test_biz_keys_that_differ_only_by_a_trailing_space_cannot_collide_in_the_outbox(
        mariadb: Db) -> None:
    # Given the outbox (publish refuses such keys; a row written another way is still a row)
    outbox = outbox_table(sa.MetaData(), mariadb.names.outbox)
    now = datetime.datetime(2024, 1, 1)
    row = {"biz_type": "order", "topic": "T", "body": b"{}", "next_retry_at": now,
           "gmt_create": now, "gmt_modified": now}
    # When two rows with biz keys "k" and "k " are written
    with mariadb.engine.begin() as conn:
        conn.execute(sa.insert(outbox), [{**row, "message_id": "m1", "biz_key": "k"},
                                         {**row, "message_id": "m2", "biz_key": "k "}])
    # Then both are kept under the unique (biz_type, biz_key)
    assert mariadb.count(outbox.name) == 2


def test_db_init_upgrade_converts_a_padding_table_and_then_both_ids_get_their_effect(
        mariadb_env: Env, caplog: pytest.LogCaptureFixture) -> None:
    env = mariadb_env
    db = env.db
    # Given every table made by the old DDL (utf8mb4_bin, which pads trailing spaces)
    schema_metadata(db.names).drop_all(db.engine)
    with db.engine.begin() as conn:
        raw = conn.execution_options(no_parameters=True)
        for statement in split_statements(render_ddl("mysql", db.names)):
            raw.exec_driver_sql(statement)
    processed = schema_metadata(db.names).tables[db.names.processed]
    assert _id_collations(db, db.names.processed) == {"utf8mb4_bin"}
    assert padding_tables(db.engine, [processed]) == [db.names.processed]
    # When a consumer starts on it, Then it warns, naming the table and the upgrade
    with caplog.at_level(logging.WARNING, logger="consumer_kit.core.db"):
        check_tables(db.engine, processed)
    assert any(db.names.processed in r.getMessage() and "trailing spaces" in r.getMessage()
               and "db init --upgrade" in r.getMessage() for r in caplog.records)
    # When `ckit db init --upgrade` runs
    init_db(db.engine, db.names, upgrade=True)
    # Then every table's ids compare NO PAD, and the two keys each get their effect
    for name in schema_metadata(db.names).tables:
        assert _id_collations(db, name) == {"utf8mb4_nopad_bin"}, name
    assert padding_tables(db.engine, list(schema_metadata(db.names).tables.values())) == []
    assert _two_entries(env) == [ConsumeStatus.CONSUME_SUCCESS] * 2
    assert env.effects() == {"[E-1]": 1, "[E-1 ]": 1}
    schema_metadata(db.names).drop_all(db.engine)  # (the transport tables too)
