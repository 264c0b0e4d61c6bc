"""What the clock checks (`consumer_kit.core.db_clock`) warned, read back by the tests."""

from __future__ import annotations

import logging
import re

import pytest


def clock_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The clock checks' warnings, in order."""
    return [r.getMessage() for r in caplog.records
            if r.name == "consumer_kit.core.db_clock" and r.levelno == logging.WARNING]


def assert_offset_said(warning: str, seconds: float, side: str) -> None:
    """`warning` says this host's clock is `seconds` `side` ("ahead of", "behind") the
    database's, to the accuracy it states: the measurement is right to within half its round
    trip, which a loaded machine stretches to 0.1 s and more; the figure has one decimal."""
    said = re.search(r"this host's clock is (\d+\.\d) s (ahead of|behind) the database's "
                     r"\(to within (\d+\.\d+) s\)", warning)
    assert said and said[2] == side, warning
    assert abs(float(said[1]) - seconds) <= float(said[3]) + 0.05, warning
