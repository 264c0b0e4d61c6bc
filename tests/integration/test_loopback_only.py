"""Every server the project's scripts start listens on loopback only: MariaDB (and the replica
of scripts/mariadb-replica.sh, with the private source it may run, and the two Galera nodes
of scripts/mariadb-galera.sh), PostgreSQL, Redis, the
RocketMQ 4.9.7 name server and broker (which 4.9.x cannot restrict itself:
scripts/loopback_bind.c), and the RocketMQ 5 name server, broker and proxy (scripts/rocketmq5.sh,
the same shim: the proxy's gRPC and remoting servers have no bind-address setting)."""

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
    services.require("mariadb replica", lambda: services.ping_mysql(services.mysql_replica_url()))
    services.require("mariadb galera", lambda: services.ping_mysql(services.mysql_galera_url()))
    services.require("mariadb galera node 2",
                     lambda: services.ping_mysql(services.mysql_galera_url2()))
    services.require("postgresql", services.ping_postgres)
    services.require("redis", services.ping_redis)
    services.require("rocketmq", services.ping_rocketmq)
    namesrv = int(services.rocketmq_addr().rsplit(":", 1)[1])
    broker = 10911  # listenPort in scripts/rocketmq.sh; the broker also opens -2 (VIP) and +1 (HA)
    postgresql = sa.engine.make_url(services.pg_url()).port or 5432  # scripts/postgres.sh port
    replica = sa.engine.make_url(services.mysql_replica_url()).port or 3307
    primary = sa.engine.make_url(services.mysql_primary_url()).port or 3306  # 3306, or 3308
    galera = sa.engine.make_url(services.mysql_galera_url()).port or 3309
    galera2 = sa.engine.make_url(services.mysql_galera_url2()).port or 3310
    ports = {"mariadb": 3306, "mariadb replica": replica, "replica's primary": primary,
             # mariadb-galera.sh: two nodes and their group communication
             "galera node 1": galera, "galera node 1 group communication": 4567,
             "galera node 2": galera2, "galera node 2 group communication": 4577,
             "postgresql": postgresql, "redis": 6379, "name server": namesrv,
             "broker": broker, "broker VIP channel": broker - 2, "broker HA": broker + 1}
    assert_loopback_only(ports)


#: The ports of scripts/rocketmq5.sh (the broker runs inside the proxy's JVM).
ROCKETMQ5_BROKER = 10951
ROCKETMQ5_PROXY_REMOTING = 8082


@pytest.mark.rocketmq5
def test_every_rocketmq5_port_listens_on_loopback_only() -> None:
    services.require("rocketmq5", services.ping_rocketmq5)
    namesrv = int(services.rocketmq5_namesrv_addr().rsplit(":", 1)[1])
    proxy = int(services.rocketmq5_proxy_addr().rsplit(":", 1)[1])
    assert_loopback_only({
        "5.x name server": namesrv, "5.x broker": ROCKETMQ5_BROKER,
        "5.x broker fast channel": ROCKETMQ5_BROKER - 2, "5.x broker HA": ROCKETMQ5_BROKER + 1,
        "5.x proxy gRPC": proxy, "5.x proxy remoting": ROCKETMQ5_PROXY_REMOTING,
    })


def assert_loopback_only(ports: dict[str, int]) -> None:
    """Each named port has a listener, and every listener of it is on a loopback address."""
    deadline = time.monotonic() + 15  # the broker opens its side ports just after it boots
    while not set(ports.values()) <= listening().keys() and time.monotonic() < deadline:
        time.sleep(0.5)
    seen = listening()
    for name, number in ports.items():
        addresses = seen.get(number)
        assert addresses, f"{name}: nothing listens on port {number}"
        assert loopback_only(addresses), (
            f"{name} (port {number}) listens on {sorted(addresses)}, not on loopback only")
