"""A handler that raises is logged with its traceback from the handler's own frames on: the
framework's frames that called it (the same for every message, and full of its own names) used
to come first."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from consumer_kit import Message
from consumer_kit.core.clock import to_epoch_ms
from consumer_kit.outcome import Outcome
from tests.consumer.conftest import Env, delivery


def raised_warning(caplog: pytest.LogCaptureFixture) -> str:
    (line,) = [r.getMessage() for r in caplog.records
               if r.name == "consumer_kit.handling" and r.levelno == logging.WARNING]
    return line


def reserve_everything(msg: Message) -> None:
    raise ValueError(f"no stock for {msg.id}")


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_a_raising_handlers_traceback_starts_at_the_handler(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler (with a session) that calls a function of its own that raises
    app = env.app()

    @app.listener("ORDER_CREATED")
    def reserve(msg: Message, session: Any) -> None:
        reserve_everything(msg)

    # When it runs, then it is retried, and the warning's traceback starts at the handler
    assert app.pipeline().process(delivery("M1")).outcome is Outcome.RETRY
    app.close()
    warning = raised_warning(caplog)
    trace = warning.split("Traceback (most recent call last):\n", 1)[1]
    assert trace.lstrip().startswith(f'File "{__file__}"'), trace
    assert "in reserve\n" in trace and "in reserve_everything\n" in trace
    assert trace.rstrip().endswith("ValueError: no stock for M1")
    assert "consumer_kit" not in trace


@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
def test_the_frameworks_frames_a_handler_called_stay_in_its_traceback(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    # Given a handler (without a session) that calls a consumer-kit function wrongly
    app = env.app()

    @app.listener("ORDER_CREATED")
    def stamp(msg: Message) -> None:
        to_epoch_ms(None)  # type: ignore[arg-type]

    # When it runs, then its traceback keeps that function's frame, after the handler's
    assert app.pipeline().process(delivery("M1")).outcome is Outcome.RETRY
    app.close()
    trace = raised_warning(caplog).split("Traceback (most recent call last):\n", 1)[1]
    assert trace.lstrip().startswith(f'File "{__file__}"'), trace
    assert "consumer_kit/core/clock.py" in trace and "in to_epoch_ms" in trace
