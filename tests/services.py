"""Where the real test services are, and how tests make sure they are up.

`scripts/setup.sh` installs and starts MariaDB, PostgreSQL, Redis and (when its scripts are
present) RocketMQ on loopback and writes their addresses to `.ckit-test.env`; `scripts/test.sh`
exports that file.
The getters below read those variables and fall back to the same defaults, so a bare `pytest`
works after `scripts/setup.sh` too.

A test (or fixture) that needs a service calls `require(name, ping)`: when the ping fails the test
is skipped locally but fails under CI (`CI=true`), so a CI run can never go green by skipping.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import NoReturn

import pytest

DEFAULT_MYSQL_URL = "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test"
DEFAULT_MYSQL_URL2 = "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_test2"
DEFAULT_MYSQL_SHARD_URLS = ",".join(
    f"mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_shard{i}" for i in (1, 2, 3))
#: scripts/mariadb-replica.sh: the primary is the shared server when it runs with the binary log,
#: else a private source on 3308 (`scripts/mariadb-replica.sh url primary` says which).
DEFAULT_MYSQL_PRIMARY_URL = "mysql+pymysql://ckit:ckit@127.0.0.1:3306/ckit_replica"
DEFAULT_MYSQL_REPLICA_URL = "mysql+pymysql://ckit:ckit@127.0.0.1:3307/ckit_replica"
DEFAULT_MYSQL_GALERA_URL = "mysql+pymysql://ckit:ckit@127.0.0.1:3309/ckit_galera"
DEFAULT_MYSQL_GALERA_URL2 = "mysql+pymysql://ckit:ckit@127.0.0.1:3310/ckit_galera"
DEFAULT_PG_URL = "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_test"
DEFAULT_PG_URL2 = "postgresql+psycopg://ckit:ckit@127.0.0.1:5432/ckit_test2"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ROCKETMQ = "127.0.0.1:9876"
DEFAULT_ROCKETMQ5_NAMESRV = "127.0.0.1:9886"
DEFAULT_ROCKETMQ5_PROXY = "127.0.0.1:8081"

CONNECT_TIMEOUT_S = 3.0


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def mysql_url() -> str:
    """SQLAlchemy URL of the main MariaDB test database (`CKIT_TEST_MYSQL_URL`)."""
    return _env("CKIT_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)


def mysql_url2() -> str:
    """SQLAlchemy URL of the second MariaDB test database (`CKIT_TEST_MYSQL_URL2`)."""
    return _env("CKIT_TEST_MYSQL_URL2", DEFAULT_MYSQL_URL2)


def mysql_shard_urls() -> list[str]:
    """The three MariaDB shard databases ckit_shard1..3 (`CKIT_TEST_MYSQL_SHARD_URLS`, comma
    separated)."""
    return _env("CKIT_TEST_MYSQL_SHARD_URLS", DEFAULT_MYSQL_SHARD_URLS).split(",")


def mysql_primary_url() -> str:
    """Database ckit_replica on the server the test replica follows
    (`CKIT_TEST_MYSQL_PRIMARY_URL`)."""
    return _env("CKIT_TEST_MYSQL_PRIMARY_URL", DEFAULT_MYSQL_PRIMARY_URL)


def mysql_replica_url() -> str:
    """Database ckit_replica on the read replica (`CKIT_TEST_MYSQL_REPLICA_URL`, read only)."""
    return _env("CKIT_TEST_MYSQL_REPLICA_URL", DEFAULT_MYSQL_REPLICA_URL)


def mysql_galera_url() -> str:
    """Database ckit_galera on node 1 of the Galera cluster of scripts/mariadb-galera.sh
    (`CKIT_TEST_MYSQL_GALERA_URL`; its user may set the node's wsrep variables)."""
    return _env("CKIT_TEST_MYSQL_GALERA_URL", DEFAULT_MYSQL_GALERA_URL)


def mysql_galera_url2() -> str:
    """Database ckit_galera on node 2 of that cluster, which joins node 1
    (`CKIT_TEST_MYSQL_GALERA_URL2`)."""
    return _env("CKIT_TEST_MYSQL_GALERA_URL2", DEFAULT_MYSQL_GALERA_URL2)


def pg_url() -> str:
    """SQLAlchemy URL of the main PostgreSQL test database (`CKIT_TEST_PG_URL`)."""
    return _env("CKIT_TEST_PG_URL", DEFAULT_PG_URL)


def pg_url2() -> str:
    """SQLAlchemy URL of the second PostgreSQL test database (`CKIT_TEST_PG_URL2`)."""
    return _env("CKIT_TEST_PG_URL2", DEFAULT_PG_URL2)


def redis_url() -> str:
    """URL of the Redis test server (`CKIT_TEST_REDIS_URL`)."""
    return _env("CKIT_TEST_REDIS_URL", DEFAULT_REDIS_URL)


def rocketmq_addr() -> str:
    """`host:port` of the RocketMQ name server (`CKIT_TEST_ROCKETMQ`)."""
    return _env("CKIT_TEST_ROCKETMQ", DEFAULT_ROCKETMQ)


def rocketmq5_namesrv_addr() -> str:
    """`host:port` of the RocketMQ 5 name server (`CKIT_TEST_ROCKETMQ5_NAMESRV`)."""
    return _env("CKIT_TEST_ROCKETMQ5_NAMESRV", DEFAULT_ROCKETMQ5_NAMESRV)


def rocketmq5_proxy_addr() -> str:
    """`host:port` of the RocketMQ 5 proxy's gRPC endpoint (`CKIT_TEST_ROCKETMQ5_PROXY`)."""
    return _env("CKIT_TEST_ROCKETMQ5_PROXY", DEFAULT_ROCKETMQ5_PROXY)


def is_ci() -> bool:
    """True when running under CI (`CI=true`), where a missing service is a failure."""
    return os.environ.get("CI", "").strip().lower() == "true"


def require(name: str, ping: Callable[[], None]) -> None:
    """Make sure service `name` answers `ping`; otherwise skip the test (locally) or fail it (CI).

    `ping` raises any exception when the service is not usable.
    """
    try:
        ping()
    except Exception as exc:
        _unavailable(name, exc)


def _unavailable(name: str, exc: BaseException) -> NoReturn:
    reason = f"{name} is not available ({type(exc).__name__}: {exc}); run scripts/setup.sh"
    if is_ci():
        pytest.fail(f"{reason} [CI=true: required services must be up]", pytrace=False)
    pytest.skip(reason)


def ping_mysql(url: str | None = None) -> None:
    """Connect to MariaDB (default: `mysql_url()`) and run SELECT 1; raise when that fails."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    engine = sa.create_engine(
        url or mysql_url(),
        poolclass=NullPool,
        connect_args={"connect_timeout": int(CONNECT_TIMEOUT_S)},
    )
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1")).scalar_one()
    finally:
        engine.dispose()


def ping_postgres(url: str | None = None) -> None:
    """Connect to PostgreSQL (default: `pg_url()`) and run SELECT 1; raise when that fails."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    url = url or pg_url()
    timeout = "timeout" if sa.make_url(url).get_driver_name() == "pg8000" else "connect_timeout"
    engine = sa.create_engine(url, poolclass=NullPool,
                              connect_args={timeout: int(CONNECT_TIMEOUT_S)})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1")).scalar_one()
    finally:
        engine.dispose()


def ping_redis(url: str | None = None) -> None:
    """PING Redis (default: `redis_url()`); raise when it does not answer."""
    import redis

    client = redis.Redis.from_url(
        url or redis_url(),
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=CONNECT_TIMEOUT_S,
    )
    try:
        if not client.ping():
            raise ConnectionError(f"Redis at {url or redis_url()} did not answer PING")
    finally:
        client.close()


def _host_port(addr: str) -> tuple[str, int]:
    # A name-server list is `host:port;host:port`; the first entry is enough to probe.
    first = addr.split(";")[0].strip()
    host, sep, port = first.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port name-server address: {addr!r}")
    return host.strip("[]"), int(port)


def ping_rocketmq(addr: str | None = None) -> None:
    """Open a TCP connection to the RocketMQ name server (default: `rocketmq_addr()`)."""
    host, port = _host_port(addr or rocketmq_addr())
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
        pass


def ping_rocketmq5(namesrv: str | None = None, proxy: str | None = None) -> None:
    """Ask the RocketMQ 5 name server for its cluster (a real remoting request: a broker must be
    registered) and open a TCP connection to the proxy's gRPC port; raise when either fails."""
    from consumer_kit.transports.rocketmq.admin import RocketMQAdmin

    RocketMQAdmin(namesrv or rocketmq5_namesrv_addr(), timeout=CONNECT_TIMEOUT_S).master_brokers()
    host, port = _host_port(proxy or rocketmq5_proxy_addr())
    with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
        pass


__all__ = [
    "is_ci",
    "mysql_galera_url",
    "mysql_galera_url2",
    "mysql_primary_url",
    "mysql_replica_url",
    "mysql_shard_urls",
    "mysql_url",
    "mysql_url2",
    "pg_url",
    "pg_url2",
    "ping_mysql",
    "ping_postgres",
    "ping_redis",
    "ping_rocketmq",
    "ping_rocketmq5",
    "redis_url",
    "require",
    "rocketmq5_namesrv_addr",
    "rocketmq5_proxy_addr",
    "rocketmq_addr",
]
