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
from outbox_producer import Dispatcher, Outbox, Relay
from tests.conftest import Db, database_url, unique_names
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
    assert "differs" in message and "build the Dispatcher on the outbox's engine" in message
    assert db.kind == "sqlite" or (":***@" in message and f":{other.url.password}@" not in message)


def test_a_session_on_another_database_than_the_dispatchers_leaves_its_rows_to_the_relay(
        db: Db, other: sa.Engine, caplog: pytest.LogCaptureFixture) -> None:
    # Given an outbox and its dispatcher on the other database, and a Session on the first
    # (a service with one outbox per database publishing through the wrong one's object)
    transport = RecordingTransport()
    dispatcher = Dispatcher(other, transport, table=db.names.outbox).start()
    outbox = Outbox(other, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    try:
        # When two messages are published through that Session
        with Session(db.engine) as session, session.begin():
            first = outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
            second = outbox.publish(session, "T", {"n": 2}, biz_type="t", biz_key="2")
        assert dispatcher.flush(10)
        # Then both rows committed with the Session's transaction, none went to the dispatcher
        # (its claim would find none of them), and one warning says why
        assert outbox_rows(db.engine, db) == 2 and outbox_rows(other, db) == 0
        assert transport.sent == []
        warned = [r.getMessage() for r in caplog.records if "left to the relay" in r.message]
        assert len(warned) == 1 and "differs" in warned[0]
        # and that database's relay sends them
        relayed = RecordingTransport()
        Relay(db.engine, relayed, table=db.names.outbox).run_once()
        assert set(relayed.counts()) == {first, second}
        # while a Session on the dispatcher's own database dispatches as always
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
    ("mysql+pymysql://u:p@db/x", "mariadb+pymysql://u:p@db:3306/x"),
    ("postgresql+psycopg://u@/x?host=db1", "postgresql+psycopg://u@db1/x"),
    ("postgresql+psycopg://u@db/x?port=5433", "postgresql+psycopg://u@db:5433/x"),
    ("sqlite://", "sqlite://"),  # in memory, or made by a creator: the URL cannot say
])
def test_urls_of_one_database_in_other_spellings_match_or_are_not_judged(a: str, b: str
                                                                       ) -> None:
    assert database_mismatch(sa.create_engine(a),
                             sa.create_engine(b)) is None


@pytest.mark.parametrize(("a", "b", "what"), [
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db/y", "database"),
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db2/x", "host"),
    ("mysql+pymysql://u:s3cret@db/x", "mysql+pymysql://u:s3cret@db:3307/x", "port"),
    ("mysql+pymysql://u:s3cret@db/x", "postgresql+psycopg://u:s3cret@db/x", "backend"),
    ("postgresql+psycopg://u@db/x", "postgresql+psycopg://u@db/y?password=s3cret", "database"),
])
def test_urls_of_other_databases_differ_and_the_message_hides_the_password(
        a: str, b: str, what: str) -> None:
    found = database_mismatch(sa.create_engine(a),
                              sa.create_engine(b))
    assert found is not None and found.startswith(what) and "s3cret" not in found


def test_a_dispatcher_given_to_the_outbox_later_is_judged_again(
        sqlite_db: Db, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given an outbox whose dispatcher was judged to work on the Session's database
    db = sqlite_db
    transport = RecordingTransport()
    dispatcher = Dispatcher(db.engine, transport, table=db.names.outbox).start()
    outbox = Outbox(db.engine, producer="orders", table=db.names.outbox, dispatcher=dispatcher)
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "T", {"n": 1}, biz_type="t", biz_key="1")
    # When it is given a dispatcher on another database
    elsewhere = make_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    other = Dispatcher(elsewhere, RecordingTransport(), table=db.names.outbox).start()
    outbox.dispatcher = other
    try:
        with Session(db.engine) as session, session.begin():
            outbox.publish(session, "T", {"n": 2}, biz_type="t", biz_key="2")
        # Then the new one is not handed rows it cannot claim: they stay for the relay, and a
        # warning says so (the old verdict would have been kept for the new dispatcher)
        assert other.flush(10) and dispatcher.flush(10)
        assert any("left to the relay" in r.message for r in caplog.records)
        with db.engine.connect() as conn:
            states = sorted(conn.execute(sa.text(f"SELECT biz_key, state FROM {db.names.outbox}")))
        assert states == [("1", int(OutboxState.SENT)), ("2", int(OutboxState.PENDING))]
    finally:
        dispatcher.close()
        other.close()
        elsewhere.dispose()


def test_a_dispatcher_refuses_an_engine_that_hands_every_thread_one_connection() -> None:
    # Given SQLAlchemy's StaticPool (the in-memory SQLite recipe of many test suites): one
    # driver connection for every thread. A dispatcher's claim, on its own thread, committed
    # whatever a caller's transaction had written on that connection so far (the order and its
    # outbox row), and the caller's rollback then undid nothing: the relay sent the message.
    engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool,
                              connect_args={"check_same_thread": False})
    names = unique_names()
    build_metadata(names, include_transport=False).create_all(engine)
    try:
        # When a dispatcher is made on it, Then it is refused, naming the pool
        with pytest.raises(ConfigError, match="StaticPool"):
            Dispatcher(engine, RecordingTransport(), table=names.outbox)
        # (an engine view of it, as `read_committed` or `execution_options` make, too)
        with pytest.raises(ConfigError, match="StaticPool"):
            Dispatcher(engine.execution_options(), RecordingTransport(), table=names.outbox)
    finally:
        engine.dispose()
