"""A password never appears in output or logs, whatever it contains (issue 11, class 3).

The nasty URLs below carry passwords with a space, an escaped and a raw `@`, `:` and `/`, and
more passwords in the query string; every fragment of them is looked for in what each `ckit`
command prints (with `-vv`, so the debug log goes through the masking formatter too).
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
import sqlalchemy as sa

from consumer_kit.cli.runtime import configure_logging
from consumer_kit.core.urls import mask_text, mask_unparsable, mask_url, remember_secrets
from tests.cli import ckit as run_ckit
from tests.cli import error_line

#: Fragments that must never be printed (each is part of a password below).
SECRETS = ("p%40ss", "p@ss", "w:rd", "S3cr3t", "Qx2sEcret", "Pw2d", "Pw3d", "sp ace")
NASTY = ("mysql+pymysql://u:p%40ss w:rd/S3cr3t@127.0.0.1:1/x"
         "?charset=utf8&password=Qx2sEcret&passwd=Pw2d;pwd=Pw3d")
NASTY_REDIS = "redis://:p%40ss w:rd@127.0.0.1:1/0?password=Qx2sEcret"


def assert_no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"leaked {leaked} in:\n{text}"


@pytest.mark.parametrize("url", [
    NASTY, NASTY_REDIS,
    "mysql+pymysql://u:p@ss w:rd@127.0.0.1/x",  # a raw @ in the password
    "mysql+pymysql://u:p@ss:S3cr3t@127.0.0.1:3306/x@y",  # a raw @ and :, and a stray @ after
    "mysql://u:p?ss S3cr3t@h/db?x=a@b",  # a ? in the password
    # a raw @ and / (SQLAlchemy reads host "ss" and database "S3cr3t@127.0.0.1/x")
    "mysql+pymysql://u:p@ss/S3cr3t@127.0.0.1/x",
    "redis://:p@ss/S3cr3t@127.0.0.1:6379/0",
    "sql+mysql+pymysql://u:S3cr3t@h/x",
    "postgresql://u@h/db?PASSWORD=Qx2sEcret",
    "sqlite:////tmp/x.db?password=sp ace Qx2sEcret",
])
def test_mask_url_hides_every_password_form(url: str) -> None:
    masked = mask_url(url)
    assert_no_secret(masked)
    assert "***" in masked
    assert_no_secret(mask_text(f"error: cannot reach {url}: refused"))


def test_mask_url_keeps_what_is_not_secret() -> None:
    assert mask_url(NASTY) == ("mysql+pymysql://u:***@127.0.0.1:1/x?charset=utf8&password=***"
                               "&passwd=***;pwd=***")
    assert mask_url("rocketmq://127.0.0.1:9876") == "rocketmq://127.0.0.1:9876"
    assert mask_url("sqlite:///a@b:c.db") == "sqlite:///a@b:c.db"


@pytest.mark.parametrize(("url", "password"), [
    ("mysql+pymysql://ckit@srv:S3cr3t@srv.example.com/orders", "S3cr3t"),  # Azure's user@srv
    ("mysql+pymysql://ckit:p%40ss:w/rd?S3cr3t@127.0.0.1/orders", "p%40ss:w/rd?S3cr3t"),
    ("postgresql+psycopg://ckit:S3cr3t@[::1]:5432/orders?sslmode=disable", "S3cr3t"),
])
def test_mask_url_and_mask_text_hide_exactly_the_password_sqlalchemy_reads(
        url: str, password: str) -> None:
    # Given a URL SQLAlchemy reads, with an @ or : beside its password
    read = sa.engine.make_url(url)
    assert read.password == unquote(password)
    # When it is masked alone and inside a driver's message
    masked = mask_url(url)
    line = f"error: failed on {url}: (1049, \"Unknown database 'orders'\")"
    # Then only that password is gone: the user, host, port, database, query and the driver's
    # words after the URL are all still there
    assert masked == url.replace(f":{password}@", ":***@", 1)
    assert sa.engine.make_url(masked).set(password=read.password) == read
    assert mask_text(line) == line.replace(url, masked)
    assert_no_secret(masked + mask_text(line))


@pytest.mark.parametrize("url", [
    "redis://:p@ss/S3cr3t@redis:6379", "mysql+pymysql://root:p@ss/S3cr3t@db:3306",
    "postgresql+psycopg://u:p@ss/S3cr3t@db?sslmode=require",
    "mysql+pymysql://app@srv:p@ss/S3cr3t@db:3306",
])
def test_a_password_with_a_raw_at_sign_is_masked_whole_though_sqlalchemy_ends_it_there(
        url: str) -> None:
    # Given a password meant with a raw @ (SQLAlchemy reads the host "ss")
    # When it is masked alone, as unparsable, and inside a line
    shown = [mask_url(url), mask_unparsable(url), mask_text(f"x {url} failed"),
             mask_text(f"x {url.replace('/S3cr3t', ':,S3cr3t')} failed")]
    # Then no piece of it is left: the last @ a host follows ends it
    for text in shown:
        assert_no_secret(text)


def test_an_at_sign_after_the_database_is_masked_with_the_password_never_less() -> None:
    # Given a stray @ after the database name: no rule tells it from a password's raw @
    url = "mysql+pymysql://ckit:S3cr3t@127.0.0.1:3306/orders@x"
    # When / Then the masking runs to it (too much, never too little)
    assert mask_url(url) == "mysql+pymysql://ckit:***@x"
    assert mask_text(f"connect {url}: (1045, \"Access denied for user 'ckit'@'h'\")") == \
        "connect mysql+pymysql://ckit:***@x: (1045, \"Access denied for user 'ckit'@'h'\")"


@pytest.mark.parametrize("template", [
    "error: cannot reach {url}: refused",
    "bad --group 'inv={url}': use NAME=URL",
    "({url})", "{url}",
])
def test_mask_text_hides_passwords_of_urls_inside_free_text(template: str) -> None:
    assert_no_secret(mask_text(template.format(url=NASTY)))


def test_mask_text_keeps_the_driver_s_words_after_a_url_with_a_password() -> None:
    # Given MySQL's refusal after the URL it refused, whose "user 'u'@'host'" holds an @ too
    line = ("error: SQL transport failed to check the schema on mysql+pymysql://u:S3cr3t@"
            "127.0.0.1:3306/x: (1045, \"Access denied for user 'u'@'127.0.0.1' (using "
            "password: YES)\")")
    # When / Then: the password is masked, the host, database and the driver's words kept
    assert mask_text(line) == line.replace("S3cr3t", "***")
    # And a password whose raw @ is followed by a quote is still masked whole
    assert_no_secret(mask_text("cannot open mysql://u:p@ss'S3cr3t@h/db: refused"))


def test_a_password_with_spaces_seen_once_is_masked_wherever_it_shows_up_again() -> None:
    remember_secrets(["sqlite:////tmp/x.db?password=sp ace Qx2sEcret"])
    assert_no_secret(mask_text("driver said: password 'sp ace Qx2sEcret' refused"))
    assert mask_text("rocketmq://127.0.0.1:9876 down; relay relay@vm:1") == \
        "rocketmq://127.0.0.1:9876 down; relay relay@vm:1"  # a host:port is not a password
    # digits then punctuation are not a port: a password may look like one
    assert_no_secret(mask_text("connect mysql://u:1234: Pw2d@db/x failed"))


def test_the_cli_log_formatter_masks_messages_arguments_and_exceptions(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Given the CLI's logging
    configure_logging(2)
    log = logging.getLogger("consumer_kit.test_secrets")
    # When a URL is logged in the message, as an argument and in an exception
    log.info("connecting to " + NASTY)
    log.debug("retry %s after %s", NASTY, "refused")
    try:
        raise RuntimeError(f"cannot open {NASTY}")
    except RuntimeError:
        log.exception("failed")
    # Then
    err = capsys.readouterr().err
    assert err.count("***") >= 3
    assert_no_secret(err)


def test_debug_logging_leaves_the_py4j_wire_log_off() -> None:
    # Given / When: the CLI's logging at -vv
    configure_logging(2)
    # Then our code logs at DEBUG, but not py4j, whose DEBUG lines are every command sent to
    # Spark's JVM, JDBC passwords included, in a format the masking cannot read
    assert logging.getLogger("consumer_kit.reconcile").isEnabledFor(logging.DEBUG)
    for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
    assert logging.getLogger("py4j.clientserver").isEnabledFor(logging.INFO)


def ckit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ckit -vv ARGS`: the debug log goes through the masking formatter too."""
    return run_ckit("-vv", *args, env=env)


def test_every_command_keeps_passwords_out_of_its_output_and_logs(tmp_path: Path) -> None:
    # Given SQLite files that work (SQLite ignores a password in the query string) and a MySQL
    # URL whose server refuses connections
    ok = f"sqlite:///{tmp_path / 'ok.db'}?password=Qx2sEcret&pwd=Pw3d"
    mq = f"sql+sqlite:///{tmp_path / 'mq.db'}?password=Qx2sEcret"
    inventory = f"sqlite:///{tmp_path / 'inv.db'}?passwd=Pw2d"
    runs = {
        "db init (works)": ckit("db", "init", "--url", ok),
        "db init --json (works)": ckit("db", "init", "--url", mq[4:], "--json"),
        "db init (refused)": ckit("db", "init", "--url", NASTY),
        "outbox stats": ckit("outbox", "stats", "--url", NASTY),
        "outbox show": ckit("outbox", "show", "1", "--url", NASTY),
        "outbox retry": ckit("outbox", "retry", "1", "--url", NASTY),
        "relay (refused)": ckit("relay", "--url", NASTY, "--transport", mq, "--once"),
        "relay (works)": ckit("relay", "--url", ok, "--transport", mq, "--once"),
        "relay (rocketmq:// with a password)": ckit(
            "relay", "--url", ok, "--transport", "rocketmq://ak:S3cr3t@127.0.0.1:1", "--once"),
        "receipts": ckit("receipts", "--url", NASTY, "--transport", mq, "--producer", "o",
                         "--burst"),
        "processed purge": ckit("processed", "purge", "--url", NASTY, "--group", "g"),
        "mq purge": ckit("mq", "purge", "--transport", mq),
        "reconcile": ckit("reconcile", "--url", NASTY, "--group", f"g={NASTY}", "--engine",
                          "sql", "-o", ""),
        "reconcile bad group": ckit("reconcile", "--url", ok, "--group", f"{NASTY}",
                                    "--engine", "sql", "-o", ""),
        "consume": ckit("consume", "examples.inventory:app", "--burst",
                        env={"INVENTORY_DB_URL": NASTY, "CKIT_TRANSPORT": mq}),
        "consume (redis)": ckit("consume", "examples.inventory:app", "--burst",
                                env={"INVENTORY_DB_URL": inventory, "CKIT_TRANSPORT": mq,
                                     "CKIT_REDIS_URL": NASTY_REDIS}),
        "demo": ckit("demo", "--redis", NASTY_REDIS, "--engine", "sql"),
        "bad option": ckit("relay", "--url", NASTY, "--transport", mq, "--batch", "0"),
    }
    for name, result in runs.items():
        text = result.stdout + result.stderr
        assert "Traceback" not in text, f"{name}:\n{text}"
        assert_no_secret(text)
    # the failures are the one-line errors, the passes printed their (masked) URLs
    assert runs["db init (works)"].returncode == 0
    assert "?password=***&pwd=***" in runs["db init (works)"].stdout
    assert runs["relay (works)"].returncode == 0
    assert all(runs[n].returncode == 2 for n in ("db init (refused)", "relay (refused)",
                                                  "consume", "demo",
                                                  "relay (rocketmq:// with a password)"))
    assert "'ak:***@127.0.0.1:1'" in runs["relay (rocketmq:// with a password)"].stderr


def test_the_cli_log_follows_stderr_after_a_caller_swaps_it_and_closes_the_old_one() -> None:
    # Given the CLI's logging configured while stderr was a stand-in (a test runner's)
    import io
    import sys

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, sys.stderr)
    first, second = io.StringIO(), io.StringIO()
    try:
        sys.stderr = first
        configure_logging(0)
        # When the stand-in is closed and stderr is another stream, and a warning is logged
        sys.stderr = second
        first.close()
        logging.getLogger("consumer_kit.test_secrets").warning("after the swap")
    finally:
        root.handlers[:], level, sys.stderr = saved[0], saved[1], saved[2]
        root.setLevel(level)
    # Then it reaches the current stderr, and no "--- Logging error ---" report
    out = second.getvalue()
    assert "WARNING consumer_kit.test_secrets: after the swap" in out
    assert "Logging error" not in out


@pytest.mark.parametrize("url", [
    "mysql+pymysql://ckit:S3cr3tWord/ckit_shard1",  # the @host forgotten: the password is "port"
    "mysql+pymysql://ckit:S3cr3t",  # a URL split at the space of its password: first piece
    "sp ace@127.0.0.1:3306/ckit_shard1",  # the second piece
])
def test_a_url_that_cannot_be_parsed_is_refused_without_any_piece_of_its_password(
        url: str) -> None:
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        make_engine(url)
    assert_no_secret(str(refused.value))
    assert "invalid database URL" in str(refused.value)


def test_a_url_refused_for_a_raw_at_sign_in_its_password_still_names_its_host() -> None:
    from consumer_kit.core.db import make_engine
    from consumer_kit.core.errors import ConfigError

    # Given a password with a raw @ and a colon (SQLAlchemy reads a port "w:rd@127.0.0.1")
    with pytest.raises(ConfigError) as refused:
        make_engine("mysql+pymysql://u:p@ss w:rd@127.0.0.1:3306/x")
    # Then the error shows all of the URL but the password
    assert_no_secret(str(refused.value))
    assert "mysql+pymysql://u:***@127.0.0.1:3306/x" in str(refused.value)


def test_a_refused_login_on_a_database_name_with_an_at_sign_keeps_the_reason_not_the_secret(
        tmp_path: Path) -> None:
    from tests.services import mysql_url, ping_mysql, require

    require("MariaDB", ping_mysql)
    # Given the SQL transport on MariaDB with a wrong password and an @ after the database
    real = sa.engine.make_url(mysql_url())
    mq = (f"sql+{real.drivername}://{real.username}:S3cr3t@{real.host}:{real.port}/"
          f"{real.database}@x")
    ok = f"sqlite:///{tmp_path / 'ok.db'}"
    assert run_ckit("db", "init", "--url", ok).returncode == 0
    # When the relay starts
    result = run_ckit("relay", "--once", "--url", ok, "--transport", mq)
    # Then its one line has the server's reason, the password masked to the stray @ (masking
    # too much, never too little)
    line = error_line(result.stderr)
    assert f"//{real.username}:***@x: " in line, line
    assert "Access denied" in line
    assert_no_secret(line)


def test_several_urls_in_one_variable_split_inside_a_password_show_no_piece_of_it(
        tmp_path: Path) -> None:
    # Given CKIT_DB_URL (space separated for relay and reconcile) holding a password with a
    # space, which splits the URL in two
    spaced = "mysql+pymysql://ckit:S3cr3t sp ace@127.0.0.1:1/x"
    mq = f"sql+sqlite:///{tmp_path / 'mq.db'}"
    for args in (("relay", "--once", "--transport", mq),
                 ("reconcile", "--engine", "sql", "-o", "", "--group",
                  f"g=sqlite:///{tmp_path / 'g.db'}")):
        result = run_ckit(*args, env={"CKIT_DB_URL": spaced})
        # Then the command stops with one line, and no piece of the password is in it
        assert result.returncode == 2, result.stdout + result.stderr
        assert_no_secret(result.stdout + result.stderr)
