"""`--expect TOPIC=g1,g2` names topics: one no outbox row carries is a misspelt one.

`ckit receipts --expect ORDRES=billing,shipping` (meaning ORDERS) left ORDERS without expected
groups, so its rows turned CONSUMED on billing's receipt alone: shipping never consumed them,
and nothing said so. `ckit outbox archive --expect ORDRES=...` archived nothing, run after run.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import Result

from consumer_kit.core.clock import utcnow
from consumer_kit.core.receipt import Receipt
from consumer_kit.core.states import OutboxState
from consumer_kit.receipts import TopicRoute
from consumer_kit.transports import open_transport
from outbox_producer import ops
from tests.cli import invoke, without_ckit_env
from tests.conftest import Db


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    without_ckit_env(monkeypatch)


ckit = invoke


def sent(db: Db, topic: str, state: OutboxState = OutboxState.SENT) -> str:
    """A row of `topic` in `state`; its message id."""
    now = utcnow()
    message_id = f"m-{uuid.uuid4().hex}"
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.begin() as conn:
        conn.execute(sa.insert(outbox).values(
            message_id=message_id, biz_type="order", biz_key=f"k-{uuid.uuid4().hex[:8]}",
            topic=topic, body=b"{}", state=int(state), next_retry_at=now, gmt_create=now,
            gmt_modified=now, created_by="orders"))
    return message_id


def state_of(db: Db, message_id: str) -> OutboxState:
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.connect() as conn:
        return OutboxState(conn.scalar(sa.select(outbox.c.state)
                                       .where(outbox.c.message_id == message_id)))


def receipts_of(db: Db, tmp_path: Path, *expect: str, force: bool = False) -> Result:
    """Billing's consumed receipt of every row sent to the receipt topic, then one
    `ckit receipts --burst` run with `expect`."""
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert ckit("db", "init", "--url", mq).exit_code == 0
    outbox = ops.OutboxTables.from_names(db.names).outbox
    with db.engine.connect() as conn:
        ids = list(conn.scalars(sa.select(outbox.c.message_id)))
    transport = open_transport(f"sql+{mq}")
    try:
        TopicRoute(transport).deliver("orders", [Receipt(i, "billing") for i in ids])
    finally:
        transport.close()
    args: list[Any] = ["receipts", "--url", db.url, "--outbox-table", db.names.outbox,
                       "--receipt-table", db.names.receipts, "--producer", "orders",
                       "--transport", f"sql+{mq}", "--burst"]
    for pair in expect:
        args += ["--expect", pair]
    return ckit(*args, *(["--force"] if force else []))


def test_receipts_refuses_an_expect_topic_no_outbox_row_carries(db: Db, tmp_path: Path) -> None:
    # Given rows of ORDERS sent, and billing's receipts of them waiting
    message_id = sent(db, "ORDERS")
    # When receipts run expecting billing and shipping on a misspelt topic
    result = receipts_of(db, tmp_path, "ORDRES=billing,shipping")
    # Then one line names the topic and the topics there, and no row turned CONSUMED on
    # billing's receipt alone (shipping never consumed it)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --expect ORDRES"), result.output
    assert "'ORDRES'" in lines[0] and "topics there: ORDERS" in lines[0]
    assert state_of(db, message_id) is OutboxState.SENT


def test_receipts_applies_an_expect_topic_the_outbox_carries(
        sqlite_db: Db, tmp_path: Path) -> None:
    message_id = sent(sqlite_db, "ORDERS")
    result = receipts_of(sqlite_db, tmp_path, "ORDERS=billing,shipping")
    # billing's receipt alone is recorded; the row waits for shipping's
    assert result.exit_code == 0, result.output
    assert state_of(sqlite_db, message_id) is OutboxState.SENT


def test_receipts_takes_a_topic_not_published_yet_with_force_or_on_an_empty_outbox(
        sqlite_db: Db, tmp_path: Path) -> None:
    # An empty outbox holds no typo to find
    empty = receipts_of(sqlite_db, tmp_path, "REFUNDS=billing")
    # A topic nothing was published on yet, next to others, runs with --force
    message_id = sent(sqlite_db, "ORDERS")
    forced = receipts_of(sqlite_db, tmp_path, "REFUNDS=billing,shipping", force=True)
    assert empty.exit_code == 0, empty.output
    assert forced.exit_code == 0, forced.output
    assert state_of(sqlite_db, message_id) is OutboxState.CONSUMED


def test_receipts_takes_an_expect_topic_whose_rows_were_all_archived(
        sqlite_db: Db, tmp_path: Path) -> None:
    # Given a quiet topic whose rows were all archived
    archived = sent(sqlite_db, "REFUNDS", OutboxState.CONSUMED)
    tables = ops.OutboxTables.from_names(sqlite_db.names)
    tables.archive.create(sqlite_db.engine, checkfirst=True)
    with sqlite_db.engine.begin() as conn:
        conn.execute(sa.insert(tables.archive).from_select(
            [c.name for c in tables.outbox.columns], sa.select(tables.outbox)))
        conn.execute(sa.delete(tables.outbox).where(tables.outbox.c.message_id == archived))
    sent(sqlite_db, "ORDERS")
    # When receipts run expecting groups on it: no typo
    result = receipts_of(sqlite_db, tmp_path, "REFUNDS=billing")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("topic", "warned"), [("ORDRES", True), ("ORDERS", False)])
def test_archive_warns_of_an_expect_topic_no_outbox_row_carries(
        sqlite_db: Db, topic: str, warned: bool) -> None:
    # Given consumed rows of ORDERS
    sent(sqlite_db, "ORDERS", OutboxState.CONSUMED)
    # When a receipt-driven archive names a topic
    result = ckit("outbox", "archive", "--url", sqlite_db.url,
                  "--outbox-table", sqlite_db.names.outbox, "--receipt-table",
                  sqlite_db.names.receipts, "--expect", f"{topic}=billing")
    # Then a misspelt one is named in a warning (it archived nothing, run after run, silently)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "WARNING" in line]
    if warned:
        assert len(lines) == 1 and "--expect ORDRES" in lines[0], result.stderr
        assert "topics there: ORDERS" in lines[0]
    else:
        assert lines == [], result.stderr
