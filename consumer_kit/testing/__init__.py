"""Test suites shipped with consumer-kit (like eventsourcing's persistence tests): run them on a
transport of your own. Needs pytest (`pip install 'consumer-kit[dev]'`)."""

from __future__ import annotations

from consumer_kit.testing.conformance import Inbox, TransportConformance
from consumer_kit.testing.harness import MAX_RECONSUME, Harness, unique, wait_for

__all__ = ["MAX_RECONSUME", "Harness", "Inbox", "TransportConformance", "unique", "wait_for"]
