"""`ckit`'s log says in one line that a killed database connection was discarded on its way back
to the pool (SQLAlchemy logged a full traceback at ERROR, alarming for what it handles)."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from consumer_kit.cli.runtime import configure_logging
from consumer_kit.core.db import make_engine
from tests import services

pytestmark = pytest.mark.mariadb


def test_a_killed_connection_given_back_to_the_pool_is_one_warning_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Given ckit's logging, and a pooled MariaDB connection the server killed mid-transaction
    url = services.mysql_url()
    engine, killer = make_engine(url), make_engine(url)
    raw = engine.raw_connection()
    cursor = raw.cursor()
    cursor.execute("SELECT CONNECTION_ID()")
    (connection_id,) = cursor.fetchone()
    cursor.close()
    with killer.connect() as conn:
        conn.execute(sa.text(f"KILL {connection_id}"))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging(0)
    try:
        capsys.readouterr()
        # When it is given back (its rollback fails)
        raw.close()
        err = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        engine.dispose()
        killer.dispose()
    # Then the log has one warning line naming the error, and no traceback
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "WARNING" in lines[0] and "Lost connection" in lines[0]
    assert "discarded, the next use opens a new one" in lines[0]
