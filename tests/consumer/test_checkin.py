"""The consumer's transaction per message goes back to the pool without the pool's reset
ROLLBACK once it has committed or rolled back itself (`consumer_kit.core.checkin`): one round
trip fewer per message on MariaDB, and nothing skipped that a reset would have undone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from consumer_kit import ConsumerApp, Message
from consumer_kit.core import checkin
from consumer_kit.core.db import make_engine
from consumer_kit.transports import ConsumeStatus
from consumer_kit.transports.memory import MemoryTransport
from tests.conftest import Db
from tests.consumer.conftest import delivery


def check_ins(engine: sa.Engine) -> list[bool]:
    """`transaction_was_reset` of every check-in of `engine`'s pool, in order."""
    seen: list[bool] = []

    @sa.event.listens_for(engine, "reset")
    def record(dbapi_conn: Any, record: Any, state: Any) -> None:
        seen.append(state.transaction_was_reset)

    return seen


def _table(engine: sa.Engine) -> sa.Table:
    table = sa.Table("ckit_checkin_t", sa.MetaData(), sa.Column("n", sa.Integer))
    table.create(engine)
    return table


def test_a_committed_connection_goes_back_to_the_pool_without_a_reset(tmp_path: Path) -> None:
    # Given
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    table = _table(engine)
    resets = check_ins(engine)
    # When: a unit of work commits
    with checkin.connection(engine) as conn, conn.begin():
        conn.execute(table.insert().values(n=1))
    # Then: checked in, reset skipped, the Connection closed, the row kept
    assert resets == [True]
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert conn.closed
    with pytest.raises(sa.exc.ResourceClosedError):
        conn.execute(sa.text("SELECT 1"))
    with engine.connect() as again:
        assert again.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1


def test_a_transaction_left_open_or_an_error_is_rolled_back_at_checkin(tmp_path: Path) -> None:
    # Given
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    table = _table(engine)
    # When: a block leaves its transaction open, another raises inside it
    with checkin.connection(engine) as conn:
        conn.execute(table.insert().values(n=1))  # autobegun, never committed
    with pytest.raises(RuntimeError), checkin.connection(engine) as conn2:
        conn2.begin()
        conn2.execute(table.insert().values(n=2))
        raise RuntimeError("handler failed")
    # Then: neither row was committed, and every connection is back in the pool
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with engine.connect() as again:
        assert again.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_give_back_after_a_statement_run_since_the_commit_resets(tmp_path: Path) -> None:
    # Given: a Connection that committed, then ran one more statement (autobegun)
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    table = _table(engine)
    conn: Connection = engine.connect()
    with conn.begin():
        conn.execute(table.insert().values(n=1))
    conn.execute(table.insert().values(n=2))
    # When
    checkin.give_back(conn)
    # Then: that statement's transaction was rolled back, not left to the next checkout
    with engine.connect() as again:
        assert again.execute(sa.select(table.c.n)).scalars().all() == [1]


def server_rollbacks(engine: sa.Engine) -> int:
    """The server's count of ROLLBACKs run by the pool's two connections, both held while
    asked (their two check-ins after it add one each)."""
    with engine.connect() as one, engine.connect() as two:
        return sum(int(c.execute(sa.text("SHOW SESSION STATUS LIKE 'Com_rollback'")).one()[1])
                   for c in (one, two))


@pytest.mark.mariadb
def test_a_consumed_message_sends_no_rollback_after_its_commit_on_mariadb(
        mariadb: Db) -> None:
    # Given: a consumer on a pool of two MariaDB connections, database-only dedupe
    engine = make_engine(mariadb.url, pool_size=2, max_overflow=0)
    stock = sa.Table("ckit_checkin_stock", sa.MetaData(),
                     sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                     sa.Column("sku", sa.String(32), nullable=False),
                     sa.Column("reserved", sa.Integer, nullable=False))
    stock.create(engine)
    app = ConsumerApp(group="checkin", db=engine, redis=None, receipts=None,
                      transport=MemoryTransport(), processed_table=mariadb.names.processed,
                      local_cache=0)

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        session.execute(sa.insert(stock).values(sku=msg.id, reserved=1))

    pipe = app.pipeline()
    try:
        before = server_rollbacks(engine)
        # When: three messages are consumed, then one of them is delivered again
        for mid in ("M1", "M2", "M3"):
            assert pipe(delivery(mid)).status is ConsumeStatus.CONSUME_SUCCESS
        assert pipe(delivery("M2")).status is ConsumeStatus.CONSUME_SUCCESS
        after = server_rollbacks(engine)
        # Then: the only ROLLBACKs are the first count's two check-ins and the duplicate's
        # own (its row is then read in a transaction that commits, on the same connection);
        # the reset after each COMMIT and after the duplicate's ROLLBACK are gone, and so is
        # the read's on a second connection (they made it 8)
        assert after - before == 3
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(stock)).scalar() == 3
    finally:
        app.close()
        stock.drop(engine)
        engine.dispose()


def test_a_pool_without_the_expected_internals_gets_its_connection_closed_as_usual(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a pool whose connections' `_close_special` takes other arguments
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    table = _table(engine)
    resets = check_ins(engine)
    conn = engine.connect()
    fairy = conn._dbapi_connection

    def other_signature() -> None:
        raise AssertionError("not to be called with no arguments")

    monkeypatch.setattr(fairy, "_close_special", other_signature)
    with conn.begin():
        conn.execute(table.insert().values(n=1))
    # When
    checkin.give_back(conn)
    # Then: closed and checked in the usual way (reset included), the row kept
    assert conn.closed
    assert resets == [False]
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with engine.connect() as again:
        assert again.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1
