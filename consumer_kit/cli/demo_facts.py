"""What `ckit demo` checks its options against and its flow injects (no heavy imports: the
CLI loads this at start)."""

from __future__ import annotations

#: Messages the demo sends a second time (a producer retry)
DUPLICATES = 3
#: The fewest orders the demo can run: its duplicates, then the one whose receipt it loses
MIN_ORDERS = DUPLICATES + 1
#: The SQLite files the demo makes in its folder: orders, inventory, the SQL transport's
DEMO_FILES = ("orders.db", "inventory.db", "mq.db")
