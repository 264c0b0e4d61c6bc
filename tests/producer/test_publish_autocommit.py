"""publish refuses a connection that commits each statement on its own: on it the outbox row
would commit at once, apart from the business change beside it (a message about a change that
may then roll back). Before, the row was written and stayed when the business change failed."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import build_metadata
from outbox_producer import Outbox
from tests.conftest import Db, database_url, unique_names


class BusinessFailed(Exception):
    pass


def test_publish_on_an_autocommit_connection_is_refused_and_writes_nothing(db: Db) -> None:
    # Given a connection in SQLAlchemy's AUTOCOMMIT (engine.begin() then sends no BEGIN)
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox)
    with pytest.raises(BusinessFailed), db.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        # When a message is published and the business change then fails
        with pytest.raises(ConfigError, match=r"needs a transaction.*autocommit"):
            outbox.publish(conn, "ORDER_CREATED", {"order_id": 1}, biz_type="order",
                           biz_key="1")
        raise BusinessFailed
    # Then no message was left behind for a change that never happened
    assert db.count(db.names.outbox) == 0


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb),
                                  pytest.param("postgresql", marks=pytest.mark.postgresql),
                                  pytest.param("pg8000", marks=pytest.mark.postgresql)])
def test_publish_through_an_engine_made_autocommit_is_refused(kind: str, tmp_path: Path) -> None:
    # Given the caller's own engine made with isolation_level="AUTOCOMMIT", on each driver
    if kind == "pg8000":
        pytest.importorskip("pg8000")
    url = database_url(kind, tmp_path)
    names = unique_names()
    metadata = build_metadata(names, include_transport=False)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    metadata.create_all(engine)
    outbox = Outbox(engine, producer="orders", table=names.outbox)
    try:
        # When it publishes inside what reads as a transaction, with a Connection and a Session
        with engine.begin() as conn, pytest.raises(ConfigError, match="autocommit"):
            outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="c")
        with Session(engine) as session, session.begin(), pytest.raises(ConfigError):
            outbox.publish(session, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="s")
        # Then nothing was written
        with engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {names.outbox}")).scalar() == 0
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def test_sqlite_with_its_own_begin_recipe_still_publishes_in_the_transaction(tmp_path: Path
                                                                            ) -> None:
    # Given SQLAlchemy's recipe for SQLite transactions: the driver's isolation_level None
    # (as under AUTOCOMMIT) and a BEGIN sent on every begin
    engine = make_engine(f"sqlite:///{tmp_path / 'recipe.db'}")
    sa.event.listen(engine, "connect",
                    lambda dbapi, _record: setattr(dbapi, "isolation_level", None))
    sa.event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
    names = unique_names()
    build_metadata(names, include_transport=False).create_all(engine)
    outbox = Outbox(engine, producer="orders", table=names.outbox)
    # When one transaction publishes and commits, and another publishes and rolls back
    with engine.begin() as conn:
        outbox.publish(conn, "ORDER_CREATED", {"n": 1}, biz_type="order", biz_key="kept")
    with pytest.raises(BusinessFailed), engine.begin() as conn:
        outbox.publish(conn, "ORDER_CREATED", {"n": 2}, biz_type="order", biz_key="undone")
        raise BusinessFailed
    # Then the first row is there and the rolled-back one is not
    with engine.connect() as conn:
        keys = conn.execute(sa.text(f"SELECT biz_key FROM {names.outbox}")).scalars().all()
    engine.dispose()
    assert keys == ["kept"]
