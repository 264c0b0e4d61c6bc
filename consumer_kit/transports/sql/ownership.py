"""A queue one member of the SQL transport owns: what it fetched, what runs, where it may commit;
and holding a queue whose callback outlived its member's shutdown until the callback returns."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from consumer_kit.core.errors import CkitError
from consumer_kit.core.messages import Delivery
from consumer_kit.transports.sql.group import GroupStore, Lease, QueueKey

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class QueueState:
    """One queue this member owns (or is giving up)."""

    key: QueueKey
    lease: Lease
    expression: str
    cursor: int  # next offset to fetch
    committed: int  # last offset written
    lease_deadline: float  # monotonic: stop handing out messages after this without a renewal
    pending: set[int] = dataclasses.field(default_factory=set)  # fetched, not done
    running: int = 0
    active: bool = True  # False: being given up or lost; buffered messages are skipped

    def commit_point(self) -> int:
        """The offset everything below which is done."""
        return min(self.pending) if self.pending else self.cursor


@dataclasses.dataclass(frozen=True)
class Work:
    """A fetched message handed to a worker."""

    state: QueueState
    offset: int
    delivery: Delivery


def hold_until_idle(state: QueueState, store: GroupStore, cond: threading.Condition,
                    every: float, give_up: Callable[[QueueState], None]) -> None:
    """Renew `state`'s lease every `every` seconds while a callback on it runs (`cond` is
    notified when one returns), then `give_up` (commit and release). Returns early when the
    lease was lost (taken over: nothing of ours to release) or the database fails (it runs
    out by itself)."""
    while True:
        with cond:
            if state.running:
                cond.wait(every)
            if not state.running:
                break
        try:
            renewed = store.renew([state.lease]).get(state.key)
        except CkitError as error:
            log.warning("could not keep %s/%d of %s: %s", *state.key, store.group, error)
            return
        if renewed is None:
            return
        state.lease = renewed
    try:
        give_up(state)
    except CkitError as error:
        log.warning("could not release %s/%d of %s: %s", *state.key, store.group, error)
