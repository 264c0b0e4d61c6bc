"""The transport conformance suite (`consumer_kit.testing`) on every backend: the `h` fixture of
tests/transports/conftest.py is parametrized over memory, sql-sqlite, sql-mariadb, rocketmq."""

from __future__ import annotations

from consumer_kit.testing import TransportConformance


class TestEveryTransport(TransportConformance):
    """Runs every conformance test against each backend."""
