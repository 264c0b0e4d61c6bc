"""A bounded in-process memory of ids this process finished: duplicates it sees again are
answered without a network round trip. Safe because "done" never becomes "not done"."""

from __future__ import annotations

import threading
from collections import OrderedDict

DEFAULT_SIZE = 100_000


class RecentlyDone:
    """An LRU set of message ids."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, message_id: object) -> bool:
        with self._lock:
            return message_id in self._ids

    def add(self, message_id: str) -> None:
        """Remember `message_id`, forgetting the oldest beyond `size`."""
        if self.size <= 0:
            return
        with self._lock:
            self._ids[message_id] = None
            self._ids.move_to_end(message_id)
            while len(self._ids) > self.size:
                self._ids.popitem(last=False)
