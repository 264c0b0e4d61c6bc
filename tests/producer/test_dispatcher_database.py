"""A dispatcher working on another database than the outbox writes to is refused before anything
is written (it used to claim none of the rows and say nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from consumer_kit.core.db import make_engine
from consumer_kit.core.errors import ConfigError
from consumer_kit.core.same_database import database_mismatch
from consumer_kit.core.schema import build_metadata
from consumer_kit.core.states import OutboxState
from outbox_producer import Dispatcher, Outbox
from tests.conftest import Db, database_url
from tests.recording import RecordingTransport


@pytest.fixture
def other(db: Db, tmp_path: Path) -> Iterator[sa.Engine]:
    """The same tables in the other database of `db`'s server (another SQLite file)."""
    engine = make_engine(database_url(db.kind, tmp_path, second=True))
    metadata = build_metadata(db.names, include_transport=False)
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def outbox_rows(engine: sa.Engine, db: Db) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {db.names.outbox}")).scalar_one())


def test_an_outbox_refuses_a_dispatcher_on_another_database(db: Db, other: sa.Engine) -> None:
    # Given a dispatcher built on the server's other database
    dispatcher = Dispatcher(other, RecordingTransport(), table=db.names.outbox)
    # When an outbox on the first database is given it, then it is refused, naming both
    with pytest.raises(ConfigError, match="dispatcher works on another database") as caught:
        Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    message = str(caught.value)
    assert "differs" in message and "the first is the outbox's engine" in message
    assert db.kind == "sqlite" or (":***@" in message and f":{other.url.password}@" not in message)


def test_publish_through_a_session_on_another_database_writes_nothing(
        db: Db, other: sa.Engine) -> None:
    # Given an outbox and its dispatcher on the other database, and a Session on the first
    transport = RecordingTransport()
    dispatcher = Dispatcher(other, transport, table=db.names.outbox).start()
    outbox = Outbox(other, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    try:
        # When a message is published through that Session, then it is refused
        with (Session(db.engine) as session, session.begin(),
              pytest.raises(ConfigError, match="this Session's engine; nothing written")):
            outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
        # and no row was written anywhere (the row used to commit here and go unsent)
        assert outbox_rows(db.engine, db) == outbox_rows(other, db) == 0
        # while the Session on the dispatcher's own database dispatches as always
        with Session(other) as session, session.begin():
            mid = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
        assert dispatcher.flush(10)
        assert list(transport.counts()) == [mid]
    finally:
        dispatcher.close()


def test_an_outbox_refuses_a_dispatcher_on_another_table(db: Db) -> None:
    dispatcher = Dispatcher(db.engine, RecordingTransport(), table=db.names.outbox)
    with pytest.raises(ConfigError, match="claims from table"):
        Outbox(db.engine, producer="orders", table=db.names.receipts, dispatcher=dispatcher)


def test_two_engines_built_from_one_url_are_one_database(db: Db) -> None:
    # Given the outbox and its dispatcher each built from the URL (two engines, two pools)
    transport = RecordingTransport()
    dispatcher = Dispatcher(db.url, transport, table=db.names.outbox).start()
    try:
        outbox = Outbox(db.url, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
        # When the application publishes through a third engine of that URL
        with Session(db.engine) as session, session.begin():
            mid = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
        # Then the dispatcher sends it
        assert dispatcher.flush(10)
        assert list(transport.counts()) == [mid]
        with db.engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT state FROM {db.names.outbox}")).scalar_one() \
                == int(OutboxState.SENT)
    finally:
        dispatcher.close()


@pytest.mark.parametrize(("a", "b"), [
    ("mysql+pymysql://u:p@localhost/x", "mysql+pymysql://u:q@127.0.0.1:3306/x"),
    ("postgresql+psycopg://u@[::1]/x", "postgresql+psycopg://v@localhost:5432/x"),
    ("postgresql+psycopg://u@db/x", "postgresql+psycopg://u@DB/x?sslmode=require"),
])
def test_urls_of_one_database_in_other_spellings_match(a: str, b: str) -> None:
    assert database_mismatch(sa.create_engine(a),
                             sa.create_engine(b)) is None


@pytest.mark.parametrize(("a", "b", "what"), [
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db/y", "database"),
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db2/x", "host"),
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db:3307/x", "port"),
    ("mysql+pymysql://u:s3cret@db/x", "postgresql+psycopg://u:s3cret@db/x", "backend"),
    ("sqlite://", "sqlite://", "in-memory SQLite database"),
])
def test_urls_of_other_databases_differ_and_the_message_hides_the_password(
        a: str, b: str, what: str) -> None:
    found = database_mismatch(sa.create_engine(a),
                              sa.create_engine(b))
    assert found is not None and found.startswith(what) and "s3cret" not in found
