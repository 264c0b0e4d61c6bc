"""`ckit relay --once` stopped part way by a database error that waiting cannot fix says what
its batches had sent and marked, and exits 1, not 2 ("nothing was done"); on MariaDB as on
SQLite and PostgreSQL, where such an error used to be waited out as an outage."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import Result
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.cli.runtime import EXIT_FAILURE, EXIT_USAGE
from consumer_kit.core.schema import outbox_table
from consumer_kit.core.states import OutboxState
from tests.cli import error_line
from tests.conftest import Db
from tests.poison import POISON, refused
from tests.producer.test_retention import publish
from tests.test_cli_scale import producer_db


def outbox_states(engine: sa.Engine, table: str) -> dict[str, OutboxState]:
    t = outbox_table(sa.MetaData(), table)
    with engine.connect() as conn:
        return {m: OutboxState(s) for m, s in conn.execute(sa.select(t.c.message_id, t.c.state))}


def sql_transport(tmp_path: Path) -> str:
    """The SQL transport on a SQLite file in `tmp_path`, its tables made."""
    url = f"sqlite:///{tmp_path / 'mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", url]).exit_code == 0
    return f"sql+{url}"


def relay_refusing(db: Db, tmp_path: Path, rows: int, refused_at: int, *extra: str
                   ) -> tuple[Result, list[str], float]:
    """`ckit relay --once` two rows a batch over `rows` due rows, the database refusing to
    update the `refused_at`-th oldest: its result, the ids oldest first, and its seconds."""
    ids = publish(db, range(rows))
    mq = sql_transport(tmp_path)
    started = time.monotonic()
    with refused(db.engine, db.names.outbox, "UPDATE", "message_id", ids[refused_at]):
        result = CliRunner().invoke(app, [
            "relay", "--url", db.url, "--outbox-table", db.names.outbox, "--transport", mq,
            "--once", "--batch", "2", "--give-up-after", "60s", *extra])
    return result, ids, time.monotonic() - started


@pytest.mark.parametrize("claim", ["lease", "lock"])
def test_a_relay_stopped_after_two_batches_says_what_it_sent_and_exits_1(
        db: Db, tmp_path: Path, claim: str) -> None:
    if claim == "lock" and db.kind == "sqlite":
        pytest.skip("--claim lock needs row locks: PostgreSQL or MariaDB")
    # Given six due rows, sent two a batch, and the database refusing to update the fifth
    # When `ckit relay --once` runs
    result, ids, seconds = relay_refusing(db, tmp_path, 6, 4, "--claim", claim)
    # Then it stops at once with the database's error (not waited out for --give-up-after as
    # an outage), says the first two batches stay sent, and exits 1
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert "database error" in line and POISON in line
    if claim == "lease":  # the fifth row's claim (an UPDATE) is refused: nothing more sent
        assert "(after 4 messages sent in 2 batches: that stays committed" in line
    else:  # rows are claimed by a lock: the third batch went out, and its marks were refused
        assert ("(after 4 messages sent in 2 batches, and 2 sent but not marked SENT (sent "
                "again when their lease ends, with --claim lock at once; consumers dedupe): "
                "that stays committed") in line
    assert seconds < 30
    states = outbox_states(db.engine, db.names.outbox)
    assert [states[m] for m in ids] == [OutboxState.SENT] * 4 + [OutboxState.PENDING] * 2


def test_a_relay_refused_in_its_first_batch_still_says_nothing_was_done(
        db: Db, tmp_path: Path) -> None:
    result, _, _ = relay_refusing(db, tmp_path, 4, 0)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "that stays committed" not in error_line(result.output)
    assert set(outbox_states(db.engine, db.names.outbox).values()) == {OutboxState.PENDING}


def test_a_relay_over_two_databases_counts_what_both_sent_before_one_failed(
        tmp_path: Path) -> None:
    # Given two producer databases, the first refusing to update its fifth row
    first, second = producer_db(tmp_path / "a.db", 6), producer_db(tmp_path / "b.db", 5)
    engines = [sa.create_engine(url) for url in (first, second)]
    with engines[0].connect() as conn:
        poisoned = conn.exec_driver_sql(
            "SELECT message_id FROM ckit_outbox ORDER BY id LIMIT 1 OFFSET 4").scalar_one()
    mq = sql_transport(tmp_path)
    # When one `ckit relay --once` serves both
    with refused(engines[0], "ckit_outbox", "UPDATE", "message_id", poisoned):
        result = CliRunner().invoke(app, ["relay", "--url", first, "--url", second,
                                          "--transport", mq, "--once", "--batch", "2"])
    # Then its line counts every message either database's batches sent: what the tables say
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    said = re.search(r"\(after (\d+) messages sent in \d+ batch(es)?: that stays committed", line)
    assert said, line
    sent = sum(list(outbox_states(e, "ckit_outbox").values()).count(OutboxState.SENT)
               for e in engines)
    assert int(said.group(1)) == sent >= 4
    for engine in engines:
        engine.dispose()


@pytest.mark.parametrize("claim", ["lease", "lock"])
def test_a_batch_stopped_by_a_misconfiguration_counts_the_sends_it_marked(
        db: Db, tmp_path: Path, claim: str) -> None:
    if claim == "lock" and db.kind == "sqlite":
        pytest.skip("--claim lock needs row locks: PostgreSQL or MariaDB")
    # Given six due rows, the fifth with a topic the transport refuses as misconfigured (a
    # row edited by hand), sent three a batch
    ids = publish(db, range(6))
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {db.names.outbox} SET topic = '' "
                             f"WHERE message_id = '{ids[4]}'")
    # When `ckit relay --once` runs
    result = CliRunner().invoke(app, [
        "relay", "--url", db.url, "--outbox-table", db.names.outbox, "--transport",
        sql_transport(tmp_path), "--once", "--batch", "3", "--claim", claim])
    # Then the line counts the fourth row too, which the stopped batch sent and marked
    assert result.exit_code == EXIT_FAILURE, result.output
    line = error_line(result.output)
    assert "topic" in line
    assert "(after 4 messages sent in 2 batches: that stays committed" in line
    states = outbox_states(db.engine, db.names.outbox)
    assert [states[m] for m in ids] == [OutboxState.SENT] * 4 + [OutboxState.PENDING] * 2
