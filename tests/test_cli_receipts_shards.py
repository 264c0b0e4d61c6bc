"""`ckit receipts` for a sharded producer: one receipt topic (`ckit-receipt-<producer>`) and
one consumer group carry the receipts of every shard's messages, batched together by each
consumer. Run once per shard, each process took whole batches and applied every receipt to its
own database (the other shards' messages there unknown, their receipts recorded in the wrong
database, their rows left SENT); run with several `--url`, each receipt goes to the database
that holds its message."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.db import make_engine
from consumer_kit.core.messages import OutgoingMessage
from consumer_kit.core.receipt import Receipt, encode_receipts, receipt_topic
from consumer_kit.core.schema import outbox_table, receipt_table
from consumer_kit.core.states import OutboxState
from consumer_kit.transports import open_transport
from tests.test_cli_scale import producer_db, sql_transport, states


def message_ids(url: str) -> list[str]:
    engine = make_engine(url)
    t = outbox_table(sa.MetaData())
    with engine.connect() as conn:
        found = [str(m) for m in conn.execute(sa.select(t.c.message_id)).scalars()]
    engine.dispose()
    return found


def receipt_ids(url: str) -> set[str]:
    engine = make_engine(url)
    t = receipt_table(sa.MetaData())
    with engine.connect() as conn:
        found = {str(m) for m in conn.execute(sa.select(t.c.message_id)).scalars()}
    engine.dispose()
    return found


def test_one_receipts_command_applies_each_receipt_to_the_shard_that_holds_its_message(
        tmp_path: Path) -> None:
    # Given two shards of producer "orders", their rows sent, and one receipt message whose
    # batch answers messages of both (as a consumer's receipt sender batches them)
    first = producer_db(tmp_path / "orders_a.db", 3)
    second = producer_db(tmp_path / "orders_b.db", 2)
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    sent = runner.invoke(app, ["relay", "--url", first, "--url", second, "--transport",
                               f"sql+{mq}", "--once"])
    assert sent.exit_code == 0, sent.output
    ids = {url: message_ids(url) for url in (first, second)}
    transport = open_transport(f"sql+{mq}")
    transport.ensure_topic(receipt_topic("orders"))
    transport.send(OutgoingMessage(receipt_topic("orders"), encode_receipts(
        Receipt(m, "inventory") for m in [*ids[first], *ids[second], "held-by-none"])))
    transport.close()
    # When one `ckit receipts` is given both shards
    result = runner.invoke(app, ["receipts", "--url", first, "--url", second, "--producer",
                                 "orders", "--transport", f"sql+{mq}", "--burst", "--json"])
    # Then every row of each is CONSUMED, each shard holds the receipts of its own messages
    # (the message no shard holds is counted unknown and recorded nowhere)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["consumed"], report["unknown"]) == (5, 1), report
    assert states(first) == states(second) == {OutboxState.CONSUMED}
    assert receipt_ids(first) == set(ids[first]) and receipt_ids(second) == set(ids[second])


def test_receipts_given_one_outbox_as_two_shards_is_refused_naming_both(tmp_path: Path) -> None:
    # Given a shard and a copy of it (a restored backup, a writable replica) given as another
    # shard: each receipt would go to whichever is listed first, the other's rows left SENT
    first = producer_db(tmp_path / "orders_a.db", 3)
    copy = tmp_path / "orders_copy.db"
    copy.write_bytes((tmp_path / "orders_a.db").read_bytes())
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["db", "init", "--url", mq]).exit_code == 0
    # When one `ckit receipts` is given both, as relay and reconcile would be
    result = runner.invoke(app, ["receipts", "--url", f"sqlite:///{copy}", "--url", first,
                                 "--producer", "orders", "--transport", f"sql+{mq}", "--burst"])
    # Then it refuses in one line naming both, before any receipt is read
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith("error: ") and len(line.splitlines()) == 1, result.stderr
    assert "--url number 2" in line and "--url number 1" in line, line
