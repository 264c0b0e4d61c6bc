"""Every server the project's scripts start listens on loopback only: MariaDB, PostgreSQL, Redis,
and the RocketMQ name server and broker (which 4.9.x cannot restrict itself:
scripts/loopback_bind.c)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from tests import services
from tests.net import listening, loopback_only


def test_proc_net_parsing_reads_loopback_and_wildcard_addresses() -> None:
    import socket

    with socket.socket() as wild, socket.socket() as loop:
        wild.bind(("0.0.0.0", 0))
        wild.listen()
        loop.bind(("127.0.0.1", 0))
        loop.listen()
        seen = listening()
        assert seen[wild.getsockname()[1]] == {"0.0.0.0"}
        assert seen[loop.getsockname()[1]] == {"127.0.0.1"}


@pytest.mark.mariadb
@pytest.mark.postgresql
@pytest.mark.redis
@pytest.mark.rocketmq
def test_every_service_port_listens_on_loopback_only() -> None:
    services.require("mariadb", services.ping_mysql)
    services.require("postgresql", services.ping_postgres)
    services.require("redis", services.ping_redis)
    services.require("rocketmq", services.ping_rocketmq)
    namesrv = int(services.rocketmq_addr().rsplit(":", 1)[1])
    broker = 10911  # listenPort in scripts/rocketmq.sh; the broker also opens -2 (VIP) and +1 (HA)
    postgresql = sa.engine.make_url(services.pg_url()).port or 5432  # scripts/postgres.sh port
    ports = {"mariadb": 3306, "postgresql": postgresql, "redis": 6379, "name server": namesrv,
             "broker": broker, "broker VIP channel": broker - 2, "broker HA": broker + 1}
    deadline = time.monotonic() + 15  # the broker opens its side ports just after it boots
    while not set(ports.values()) <= listening().keys() and time.monotonic() < deadline:
        time.sleep(0.5)
    seen = listening()
    for name, number in ports.items():
        addresses = seen.get(number)
        assert addresses, f"{name}: nothing listens on port {number}"
        assert loopback_only(addresses), (
            f"{name} (port {number}) listens on {sorted(addresses)}, not on loopback only")
