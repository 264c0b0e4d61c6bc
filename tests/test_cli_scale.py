"""`ckit relay` and `ckit reconcile` over several producer databases and read replicas, from the
command line (SQLite files; the real MariaDB shards and replica: tests/integration)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from consumer_kit.cli.main import app
from consumer_kit.core.db import make_engine
from consumer_kit.core.schema import (
    TableNames,
    build_metadata,
    outbox_archive_table,
    outbox_table,
)
from consumer_kit.core.states import OutboxState
from outbox_producer import Outbox
from tests.cli import error_line


def producer_db(path: Path, rows: int) -> str:
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    build_metadata(TableNames(), include_transport=False).create_all(engine)
    outbox = Outbox(engine, producer="orders")
    with engine.begin() as conn:
        for k in range(rows):
            outbox.publish(conn, "T", {"k": k}, biz_type="t", biz_key=f"{path.stem}-{k}")
    engine.dispose()
    return url


def sql_transport(tmp_path: Path) -> str:
    """A SQL transport database in `tmp_path`, its tables made: its URL (without `sql+`)."""
    mq = f"sqlite:///{tmp_path / 'mq.db'}"
    assert CliRunner().invoke(app, ["db", "init", "--url", mq]).exit_code == 0
    return mq


def publish_more(url: str, prefix: str, n: int) -> None:
    """Publish `n` more messages (biz keys `prefix-0`, ...) into the outbox at `url`."""
    engine = make_engine(url)
    with engine.begin() as conn:
        for k in range(n):
            Outbox(engine, producer="orders").publish(conn, "T", {}, biz_type="t",
                                                      biz_key=f"{prefix}-{k}")
    engine.dispose()


def states(url: str) -> set[OutboxState]:
    engine = make_engine(url)
    t = outbox_table(sa.MetaData())
    with engine.connect() as conn:
        found = {OutboxState(s) for s in conn.execute(sa.select(t.c.state)).scalars()}
    engine.dispose()
    return found


def test_one_relay_command_serves_several_producer_databases(tmp_path: Path) -> None:
    # Given two producer databases with 7 and 5 due rows, and an SQL transport
    first = producer_db(tmp_path / "orders_a.db", 7)
    second = producer_db(tmp_path / "orders_b.db", 5)
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    # When one `ckit relay --once` is given both
    result = runner.invoke(app, ["relay", "--url", first, "--url", second, "--transport",
                                 f"sql+{mq}", "--once", "--json"])
    # Then it drained both and reports each database
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["sent"] == 12
    assert [(d["database"], d["sent"]) for d in report["databases"]] == [(first, 7), (second, 5)]
    assert states(first) == states(second) == {OutboxState.SENT}


def test_read_urls_must_pair_with_the_producer_urls(tmp_path: Path) -> None:
    first, second = producer_db(tmp_path / "a.db", 0), producer_db(tmp_path / "b.db", 0)
    runner = CliRunner()
    relay = runner.invoke(app, ["relay", "--url", first, "--url", second, "--read-url", first,
                                "--transport", f"sql+sqlite:///{tmp_path / 'mq.db'}", "--once"])
    reconcile = runner.invoke(app, ["reconcile", "--engine", "sql", "--url", first, "--url",
                                    second, "--read-url", first, "--group", f"g={first}"])
    for result in (relay, reconcile):
        assert result.exit_code == 2
        assert "give one --read-url per --url (2), or none; got 1" in result.output


def test_a_read_url_that_cannot_be_the_replica_is_refused_before_any_row_moves(
        tmp_path: Path) -> None:
    # Given two producer databases with due rows, the SQL transport, and read URLs that cannot
    # be their replicas: a SQLite file that is not there, a database without the outbox, and
    # the two swapped (the same ids, other messages)
    first, second = producer_db(tmp_path / "a.db", 3), producer_db(tmp_path / "b.db", 3)
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    make_engine(empty).connect().close()
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    cases = {
        "missing file": ([first], [f"sqlite:///{tmp_path / 'typo.db'}"], "typo.db"),
        "no outbox": ([first], [empty], "ckit_outbox missing"),
        "swapped": ([first, second], [second, first],
                    "--read-url number 1 is not a replica of --url number 1"),
    }
    for name, (urls, read_urls, expected) in cases.items():
        args = ["relay", "--transport", f"sql+{mq}", "--once"]
        args += [a for u in urls for a in ("--url", u)]
        args += [a for u in read_urls for a in ("--read-url", u)]
        # When the relay starts, Then it stops with one line naming the problem
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (name, result.output)
        assert expected in result.output, (name, result.output)
    # and nothing was sent, no SQLite file made
    assert states(first) == states(second) == {OutboxState.PENDING}
    assert not (tmp_path / "typo.db").exists()


def test_delayed_checks_need_a_running_relay(tmp_path: Path) -> None:
    url = producer_db(tmp_path / "a.db", 0)
    result = CliRunner().invoke(app, ["relay", "--url", url, "--transport",
                                      f"sql+sqlite:///{tmp_path / 'mq.db'}", "--once",
                                      "--check-topic", "ckit-check"])
    assert result.exit_code == 2 and "--check-topic needs a running relay" in result.output


def mq_messages(mq: str) -> int:
    engine = make_engine(mq)
    with engine.connect() as conn:
        count = int(conn.execute(sa.text("SELECT COUNT(*) FROM ckit_mq_message")).scalar_one())
    engine.dispose()
    return count


def test_a_copy_of_a_producer_database_given_as_another_shard_is_refused_before_any_row_moves(
        tmp_path: Path) -> None:
    # Given a producer database with 4 due rows, a copy of it (a writable replica, a restored
    # backup) that lags it by 2 rows, and the SQL transport
    first = producer_db(tmp_path / "a.db", 4)
    shutil.copy(tmp_path / "a.db", tmp_path / "copy.db")
    publish_more(first, "late", 2)
    copy = f"sqlite:///{tmp_path / 'copy.db'}"
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    # When one relay is given both as shards (in either order)
    for urls in ([first, copy], [copy, first]):
        result = runner.invoke(app, ["relay", "--url", urls[0], "--url", urls[1],
                                     "--transport", f"sql+{mq}", "--once"])
        # Then it stops with one line naming both, before any row moves (it sent every row of
        # the copy a second time)
        assert result.exit_code == 2, result.output
        assert "--url number 2" in error_line(result.output)
        assert "holds the outbox of --url number 1" in result.output
    assert states(first) == states(copy) == {OutboxState.PENDING}
    assert mq_messages(mq) == 0


def test_the_relay_refuses_a_producer_sqlite_file_that_is_not_there_without_making_it(
        tmp_path: Path) -> None:
    # Given the SQL transport and a producer URL naming a file that is not there (a typo)
    mq = sql_transport(tmp_path)
    # When the relay starts
    result = CliRunner().invoke(app, ["relay", "--url", f"sqlite:///{tmp_path / 'typo.db'}",
                                      "--transport", f"sql+{mq}", "--once"])
    # Then it says so in one line and leaves no empty file behind
    assert result.exit_code == 2
    assert "typo.db does not exist" in error_line(result.output)
    assert not (tmp_path / "typo.db").exists()


def test_a_read_url_with_an_empty_outbox_beside_a_primary_with_rows_is_warned_about(
        tmp_path: Path) -> None:
    # Given a producer database with due rows, and as its --read-url another database whose
    # outbox is empty (not refused: a new replica starts empty)
    first = producer_db(tmp_path / "a.db", 3)
    other = producer_db(tmp_path / "other.db", 0)
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    # When the relay runs once
    result = runner.invoke(app, ["relay", "--url", first, "--read-url", other, "--transport",
                                 f"sql+{mq}", "--once"])
    # Then it says the replica may be another database, and still sends through the primary
    assert result.exit_code == 0, result.output
    assert "--read-url number 1 has no outbox row while --url number 1 has some" in \
        result.output
    assert states(first) == {OutboxState.SENT}


def test_a_read_url_holding_rows_its_primary_never_had_is_refused_before_any_row_moves(
        tmp_path: Path) -> None:
    # Given a producer database with 3 due rows, and as its --read-url a copy of it written to
    # since (a promoted replica the application now writes to, another database that shares
    # its oldest rows): its newest rows are in neither the primary's outbox nor its archive
    first = producer_db(tmp_path / "a.db", 3)
    shutil.copy(tmp_path / "a.db", tmp_path / "promoted.db")
    promoted = f"sqlite:///{tmp_path / 'promoted.db'}"
    publish_more(promoted, "after", 2)
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    # When the relay starts with it (it ran, exit 0: a replica is never ahead of its primary,
    # and the rows only the copy holds were left to no relay)
    result = runner.invoke(app, ["relay", "--url", first, "--read-url", promoted,
                                 "--transport", f"sql+{mq}", "--once"])
    # Then it stops with one line, before any row moves
    assert result.exit_code == 2, result.output
    assert "--read-url number 1 is not a replica of --url number 1" in error_line(result.output)
    assert "neither in its outbox nor in its archive" in result.output
    assert states(first) == {OutboxState.PENDING}
    assert mq_messages(mq) == 0


def test_a_read_url_lagging_behind_an_archive_on_its_primary_is_accepted(tmp_path: Path) -> None:
    # Given a primary whose newest row was archived (moved to <outbox>_archive) since its
    # replica copied it
    first = producer_db(tmp_path / "a.db", 2)
    shutil.copy(tmp_path / "a.db", tmp_path / "replica.db")
    engine = make_engine(first)
    outbox = outbox_table(sa.MetaData())
    archive = outbox_archive_table(sa.MetaData(), "ckit_outbox_archive")
    archive.create(engine, checkfirst=True)
    with engine.begin() as conn:
        newest = conn.execute(sa.select(outbox).order_by(outbox.c.id.desc()).limit(1)).one()
        conn.execute(sa.insert(archive).values(
            {c.name: getattr(newest, c.name) for c in archive.columns if c.name in newest._fields}))
        conn.execute(sa.delete(outbox).where(outbox.c.id == newest.id))
    engine.dispose()
    mq = sql_transport(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["relay", "--url", first, "--read-url",
                                 f"sqlite:///{tmp_path / 'replica.db'}", "--transport",
                                 f"sql+{mq}", "--once"])
    assert result.exit_code == 0, result.output
    assert states(first) == {OutboxState.SENT}
