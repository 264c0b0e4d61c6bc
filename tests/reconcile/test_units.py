"""The reconciler's pure parts: the rules, option parsing, JDBC URL conversion, jar lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer_kit.core.errors import ConfigError
from consumer_kit.core.schema import REASON_LEN
from consumer_kit.reconcile import Evidence, GroupSource, RepairClass, WindowRow, classify
from spark.jdbc import find_jars, literal, to_jdbc

GROUPS = [GroupSource("a", "sqlite:///a.db"), GroupSource("b", "sqlite:///b.db")]


def _row(state: int = 2, retry_count: int = 0, max_retries: int = 3, topic: str = "T") -> WindowRow:
    return WindowRow(id=1, message_id="m1", topic=topic, state=state, retry_count=retry_count,
                     max_retries=max_retries, lock_version=0)


def test_a_rejection_by_any_group_wins_over_success_elsewhere() -> None:
    # Given group a succeeded and group b acked `rejected`
    evidence = [Evidence("a", processed_status="SUCCEEDED"),
                Evidence("b", receipt_outcome="rejected", receipt_reason="no such sku")]
    # When classified / Then it is REJECTED with b's reason
    d = classify(_row(), evidence, GROUPS)
    assert (d.klass, d.reason) == (RepairClass.REJECTED, "b: no such sku")


def test_a_groups_own_success_wins_over_an_older_rejected_receipt_of_the_same_group() -> None:
    # Given group a rejected the message, was made to run it again (`ckit outbox retry`) and
    # processed it, its consumed receipt not here yet; b processed it too
    evidence = [Evidence("a", processed_status="SUCCEEDED", receipt_outcome="rejected",
                         receipt_reason="out of stock"),
                Evidence("b", processed_status="SUCCEEDED")]
    # When classified / Then consumed (its receipt lost), not rejected; a's consumed receipt
    # owed too (it replaces the rejected one)
    d = classify(_row(), evidence, GROUPS)
    assert (d.klass, d.missing_receipts) == (RepairClass.RECEIPT_LOST, ("a", "b"))


def test_ack_or_processed_success_counts_and_only_missing_ack_rows_are_inserted() -> None:
    # Given a acked (its processed row purged) and b processed without an ack
    evidence = [Evidence("a", receipt_outcome="consumed"),
                Evidence("b", processed_status="SUCCEEDED")]
    # When classified / Then ack lost, with only b's ack row to insert
    d = classify(_row(), evidence, GROUPS)
    assert (d.klass, d.missing_receipts) == (RepairClass.RECEIPT_LOST, ("b",))


def test_missing_group_retries_until_the_override_is_reached() -> None:
    # Given only a processed the message
    evidence = [Evidence("a", processed_status="SUCCEEDED")]
    # When classified with retries left, then with the --max-retries override reached
    retry = classify(_row(retry_count=1), evidence, GROUPS)
    exhausted = classify(_row(retry_count=1), evidence, GROUPS, max_retries=1)
    # Then a re-send first, then FAILED naming the group that never consumed it
    assert (retry.klass, retry.groups_missing) == (RepairClass.RETRY, ("b",))
    assert exhausted.klass is RepairClass.EXHAUSTED and "by b after 1" in (exhausted.reason or "")


def test_every_reason_fits_the_column_however_many_groups_missed_the_message() -> None:
    # Given 40 groups with long names, none of which processed the message
    groups = [GroupSource(f"group-{i}-" + "x" * 60, "sqlite:///g.db") for i in range(40)]
    for retry_count in (0, 3):  # retries left, then spent
        # When classified
        d = classify(_row(retry_count=retry_count), [], groups)
        # Then its reason fits fail_reason
        assert d.reason is not None and len(d.reason) <= REASON_LEN


def test_sending_rows_are_stuck_and_topics_nobody_consumes_are_unmatched() -> None:
    groups = [GroupSource("a", "sqlite:///a.db", topics=("ORDER",))]
    assert classify(_row(state=1), [], groups).klass is RepairClass.STUCK_SENDING
    assert classify(_row(topic="AUDIT"), [], groups).klass is RepairClass.UNMATCHED
    assert classify(_row(topic="ORDER"), [Evidence("zzz", processed_status="SUCCEEDED")],
                    groups).klass is RepairClass.RETRY  # other groups' evidence is ignored


def test_group_option_parses_name_topics_and_url() -> None:
    g = GroupSource.parse("billing:PAYMENT,REFUND=mysql+pymysql://u:p@h/db", table="proc")
    assert (g.name, g.topics, g.url, g.table) == (
        "billing", ("PAYMENT", "REFUND"), "mysql+pymysql://u:p@h/db", "proc")
    own = GroupSource.parse("inv@inv_processed=sqlite:///i.db", table="proc")
    assert (own.name, own.table, own.topics) == ("inv", "inv_processed", ())
    with pytest.raises(ConfigError):
        GroupSource.parse("no-url-here")
    with pytest.raises(ConfigError):
        GroupSource.parse("g=sqlite:///x.db", table="bad name;")


def test_jdbc_conversion_keeps_the_password_out_of_the_url_and_repr() -> None:
    # Given a MariaDB URL with a password
    src = to_jdbc("mysql+pymysql://app:s3cret@db.local:3307/orders?charset=utf8mb4")
    # Then the JDBC URL selects Spark's MySQL dialect with the MariaDB driver
    assert src.url == "jdbc:mysql://db.local:3307/orders?permitMysqlScheme"
    assert src.properties["driver"] == "org.mariadb.jdbc.Driver"
    assert src.properties["password"] == "s3cret"
    assert "s3cret" not in repr(src) and "s3cret" not in src.url


def test_a_postgresql_url_becomes_a_pgjdbc_source_without_the_password_in_it() -> None:
    # Given a PostgreSQL URL (any driver) with a password
    src = to_jdbc("postgresql+psycopg://app:s3cret@db.local:5433/orders")
    # Then pgJDBC reads it, and the password travels in the properties only
    assert src.url == "jdbc:postgresql://db.local:5433/orders"
    assert src.properties["driver"] == "org.postgresql.Driver"
    assert src.properties["password"] == "s3cret" and src.dialect == "postgresql"
    assert "s3cret" not in repr(src) and "s3cret" not in src.url


def test_jdbc_conversion_of_sqlite_paths_and_unsupported_urls(tmp_path: Path) -> None:
    assert to_jdbc(f"sqlite:///{tmp_path}/x.db").url == f"jdbc:sqlite:{tmp_path}/x.db"
    with pytest.raises(ConfigError, match="in-memory"):
        to_jdbc("sqlite://")
    # the file the producer's driver opens: a file: URI read as one, a ~ not expanded
    assert to_jdbc(f"sqlite:///file:{tmp_path}/y.db?uri=true").url == f"jdbc:sqlite:{tmp_path}/y.db"
    with pytest.raises(ConfigError, match="in-memory"):
        to_jdbc("sqlite:///file:mq?mode=memory&uri=true")
    assert to_jdbc("sqlite:///~/z.db").url == f"jdbc:sqlite:{Path('~/z.db').resolve()}"
    with pytest.raises(ConfigError, match="--engine sql"):
        to_jdbc("mssql+pyodbc://u:pw@h/db")


def test_missing_driver_jars_name_the_setup_script(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    # Given no CKIT_JDBC_JARS and an empty java folder
    monkeypatch.setattr("spark.jdbc.JAVA_DIR", str(tmp_path))
    # When the jars are looked up / Then the error says how to get them
    with pytest.raises(ConfigError, match=r"scripts/jdbc\.sh"):
        find_jars({"mysql"}, env={})
    jar = tmp_path / "x.jar"
    jar.write_bytes(b"")
    assert find_jars({"mysql"}, env={"CKIT_JDBC_JARS": str(jar)}) == [str(jar)]
    with pytest.raises(ConfigError, match=r"scripts/jdbc\.sh"):
        find_jars({"mysql"}, env={"CKIT_JDBC_JARS": f"{jar},{tmp_path}/gone.jar"})


def test_only_plain_text_becomes_a_read_side_literal() -> None:
    assert literal("01HZX-abc:1") == "'01HZX-abc:1'"
    assert literal("it's") is None and literal("a\\b") is None and literal("a\nb") is None


def test_partitions_follow_the_window_size_and_the_cores() -> None:
    from spark.reads import MAX_PARTITIONS, partitions_for

    assert partitions_for(0) == 1
    assert partitions_for(10_000, parallelism=2) == 2  # one per core when each gets enough rows
    assert partitions_for(1_000, parallelism=8) == 1
    assert partitions_for(1_000_000, parallelism=2) == 20  # 50,000 rows each
    assert partitions_for(100_000_000) == MAX_PARTITIONS


def test_time_slices_cover_the_range_without_gaps_and_stay_open_ended() -> None:
    import datetime as dt

    from spark.reads import time_slices

    start = dt.datetime(2026, 1, 1)
    slices = time_slices(start, start + dt.timedelta(hours=3), 3)
    assert slices[0] == ("processed_at >= '2026-01-01 00:00:00.000000' "
                         "AND processed_at < '2026-01-01 01:00:00.000000'")
    assert slices[-1] == "processed_at >= '2026-01-01 02:00:00.000000'"


def test_failure_classes_are_the_ones_that_alert_by_default() -> None:
    failures = {k for k in RepairClass if k.is_failure}
    assert failures == {RepairClass.REJECTED, RepairClass.EXHAUSTED, RepairClass.UNMATCHED,
                        RepairClass.BEYOND_DEDUPE}


def test_cli_defaults_are_the_model_defaults() -> None:
    import inspect

    from consumer_kit.cli.reconcile import duration_text, reconcile
    from consumer_kit.core.clock import parse_duration
    from consumer_kit.reconcile import ReconcileConfig

    # Given the `ckit reconcile` options and a config built from code with no overrides
    params = inspect.signature(reconcile).parameters
    options = {name: p.default.default for name, p in params.items()
               if hasattr(p.default, "default")}
    config = ReconcileConfig(producer_url="sqlite:///o.db", groups=(GROUPS[0],))
    # Then both start from the same defaults
    assert parse_duration(options["stuck_after"]) == config.stuck_after
    assert parse_duration(options["orphan_window"]) == config.orphan_window
    assert (options["engine"], options["batch_size"]) == (config.engine, config.batch_size)
    assert duration_text(parse_duration("90s")) == "90s"
    assert duration_text(config.stuck_after) == "10m"


@pytest.mark.parametrize(("url", "user", "password"), [
    ("mysql+pymysql://app:pw@db/orders", "app", "pw"),
    ("mysql+pymysql://app@db/orders?password=q%40ry", "app", "q@ry"),
    ("mysql+pymysql://app:pw@db/orders?passwd=query", "app", "query"),  # as PyMySQL takes it
    ("postgresql+psycopg://app@db/orders?password=pgpw", "app", "pgpw"),
    ("postgresql+psycopg://db/orders?user=other&password=x", "other", "x"),
])
def test_spark_reads_with_the_credentials_the_python_driver_would_use(
        url: str, user: str, password: str) -> None:
    src = to_jdbc(url)
    assert (src.properties.get("user"), src.properties.get("password")) == (user, password)
    assert password not in src.url and password not in src.display


def test_latest_json_stays_the_last_whole_summary_when_a_write_fails_part_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt
    import errno
    import json

    from consumer_kit.reconcile.report import ReconcileSummary, write_output

    def summary(at: int) -> ReconcileSummary:
        now = dt.datetime(2026, 11, 29, 12, at)
        return ReconcileSummary(engine="sql", dry_run=False, now=now, cutoff=now,
                                producer="sqlite:///orders.db", groups=[])

    # Given a run's summary in latest.json
    write_output(summary(0), tmp_path)
    first = (tmp_path / "latest.json").read_text()
    # When the next run's write of it stops half way (a full disk)
    real = Path.write_text

    def half(self: Path, text: str, *args: object, **kwargs: object) -> int:
        if self.name != "summary.json":
            real(self, text[: len(text) // 2], encoding="utf-8")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, encoding="utf-8")

    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(OSError):
        write_output(summary(1), tmp_path)
    monkeypatch.undo()
    # Then a monitor still reads the last whole summary, and no partial file is left
    assert (tmp_path / "latest.json").read_text() == first
    assert json.loads(first)["now"].startswith("2026-11-29")
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["latest.json"]
