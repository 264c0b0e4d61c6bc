"""What the fault run's services hold: databases, business tables, topic, groups and URLs.

The producer's database holds the orders and the outbox; the consumer's database holds the effect
rows and the processed table; with `--transport sql` a third database on the same server is the
broker. The server is the run's MariaDB, or with `--db postgresql` its PostgreSQL. The effect
table has no unique key on purpose: a message applied twice shows up as two rows for one order.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.faults import kit

TOPIC = "FAULT_ORDER"
TAGS = "created"
PRODUCER = "fault-orders"
GROUP = "fault-inventory"
#: the group's retryMaxTimes on RocketMQ 5 (set before the consumers start): RocketMQ's default,
#: the one the 4.9.7 run's auto-created group has; with the transport's default back-off (10 s,
#: 30 s, 1 min, ...) a short run never spends it
GROUP_RETRIES = 16
RECEIPT_TOPIC = kit.receipt_topic(PRODUCER)

ORDERS_DB = "faults_orders"
INVENTORY_DB = "faults_inventory"
MQ_DB = "faults_mq"
DATABASES = (ORDERS_DB, INVENTORY_DB, MQ_DB)
DB_USER = "ckit"
DB_PASSWORD = "ckit"  # the project's fixed test credentials; the server listens on loopback only

metadata = sa.MetaData()
orders = sa.Table(
    "fault_orders", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("sku", sa.String(32), nullable=False),
    sa.Column("placed_at", sa.Double, nullable=False),
)
effects = sa.Table(
    "fault_effects", metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("order_id", sa.Integer, nullable=False, index=True),  # NOT unique: doubles show
    sa.Column("message_id", sa.String(64), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("at", sa.Double, nullable=False)  # epoch seconds: DOUBLE, not FLOAT,
)


#: the SQLAlchemy scheme of each `--db`
SCHEMES = {"mariadb": "mysql+pymysql", "postgresql": "postgresql+psycopg"}


@dataclasses.dataclass(frozen=True)
class Urls:
    """Where everything is (these URLs carry the test password: print them through kit.mask)."""

    db_port: int
    redis: str
    transport: str
    #: `--db`: mariadb or postgresql
    db_kind: str = "mariadb"

    def db(self, name: str) -> str:
        """SQLAlchemy URL of database `name` on the run's MariaDB (or PostgreSQL)."""
        return (f"{SCHEMES[self.db_kind]}://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{self.db_port}/"
                f"{name}")

    @property
    def orders(self) -> str:
        return self.db(ORDERS_DB)

    @property
    def inventory(self) -> str:
        return self.db(INVENTORY_DB)


def transport_url(kind: str, *, db_port: int, namesrv_port: int,
                  proxy_port: int | None = None, db_kind: str = "mariadb") -> str:
    """The transport URL for `--transport sql|rocketmq|rocketmq5` (sql: on the run's database;
    RocketMQ 5: the proxy's gRPC port, with the name server for what the proxy cannot do:
    topics, groups, dead letters)."""
    if kind == "sql":
        return "sql+" + Urls(db_port, "", "", db_kind).db(MQ_DB)
    if kind == "rocketmq5":
        if proxy_port is None:
            raise ValueError("rocketmq5 needs the proxy's port")
        return f"rocketmq5://127.0.0.1:{proxy_port}?namesrv=127.0.0.1:{namesrv_port}"
    return f"rocketmq://127.0.0.1:{namesrv_port}"


def connect_args(url: str) -> dict[str, int]:
    """Short connect timeouts for the runner's and the producer's engines (psycopg has no
    read/write timeout: a killed PostgreSQL resets its connections)."""
    if url.startswith("postgresql"):
        return {"connect_timeout": 3}
    return {"connect_timeout": 3, "read_timeout": 30, "write_timeout": 30}


def engine(url: str) -> Engine:
    """A small engine for the runner's own reads: short timeouts, no pooled dead connections."""
    return sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                            connect_args=connect_args(url))


def create_tables(urls: Urls, *, sql_transport: bool, timeout: float = 120) -> None:
    """`ckit db init` on every database the run uses, then the business tables."""
    names = [ORDERS_DB, INVENTORY_DB] + ([MQ_DB] if sql_transport else [])
    for name in names:
        proc = subprocess.run([*kit.CLI, "db", "init", "--json"],
                              env=child_env({"CKIT_DB_URL": urls.db(name)}),
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ckit db init on {name} failed: "
                               f"{kit.mask(proc.stderr.strip()[-500:])}")
    for url, table in ((urls.orders, orders), (urls.inventory, effects)):
        eng = engine(url)
        try:
            table.create(eng, checkfirst=True)
        finally:
            eng.dispose()


def child_env(extra: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this checkout first on PYTHONPATH, no inherited
    CKIT_* settings (the runner passes each one it means), plus `extra`."""
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in (base or dict(os.environ)).items() if not k.startswith("CKIT_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]])
    env.update(extra)
    return env
