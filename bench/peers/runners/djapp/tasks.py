"""jaiminho's outbox stores a dill reference to the decorated function: it must live in an
importable module (a function of `__main__` would be pickled by value)."""

from __future__ import annotations

from typing import Any

from jaiminho.send import save_to_outbox

#: calls that reached the "broker" (a no-op), counted by the runner
SENT = [0]


@save_to_outbox
def send_order(message: dict[str, Any]) -> None:
    SENT[0] += 1
