"""Lease tokens: unique per claim across threads and processes, cheaper than a uuid4 each.

A random per-process prefix and a counter; a forked child draws a new prefix, so parent and
child never hand out the same token (two holders of one lease).
"""

from __future__ import annotations

import itertools
import os
import uuid

_prefix = uuid.uuid4().hex[:16]
_seq = itertools.count()


def new_token() -> str:
    """A lease token no other claim of any process uses."""
    return f"{_prefix}{next(_seq):x}"


def _after_fork() -> None:
    global _prefix, _seq
    _prefix = uuid.uuid4().hex[:16]
    _seq = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
