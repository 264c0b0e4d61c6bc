"""The Spark session of the reconciler: local or submitted, JDBC driver jars, loopback-only
driver servers in local mode, and quiet logs."""

from __future__ import annotations

import os
from typing import Any

from consumer_kit.core.errors import ConfigError
from consumer_kit.reconcile.model import ReconcileConfig
from spark.jdbc import JAR_PATTERNS, find_jars

DEFAULT_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # our own progress lines instead of stage bars
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
}

#: In local mode the driver's RPC and block-manager servers stay on loopback (Spark otherwise
#: binds the address its host name resolves to, an external interface). Not for a cluster,
#: whose executors must reach the driver; `--conf` overrides either way.
LOOPBACK_DRIVER_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}



def is_local_master(master: str | None) -> bool:
    """True for `local`, `local[N]`, `local[*]` and `local[N,F]` (a driver-only Spark)."""
    return master is not None and (master == "local" or master.startswith("local["))


def build_session(config: ReconcileConfig, dialects: set[str]) -> Any:
    """Start (or join) a SparkSession with the JDBC driver jars on its classpath.

    `spark.jars.packages` in `config.spark_conf` (a cluster) replaces the local jar lookup.

    Raises:
        ConfigError: a JDBC driver jar is missing (names `scripts/jdbc.sh`).
    """
    from pyspark.sql import SparkSession

    user = dict(config.spark_conf)
    conf = dict(DEFAULT_SPARK_CONF)
    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if is_local_master(config.master or (_submitted_master() if submitted else None)):
        conf.update(LOOPBACK_DRIVER_CONF)
    if submitted:
        _check_submitted_jars(user)
    elif "spark.jars.packages" not in user and "spark.jars" not in user:
        conf["spark.jars"] = ",".join(_all_jars(dialects))
    conf.update(user)
    builder = SparkSession.builder.appName("ckit-reconcile")
    if config.master:
        builder = builder.master(config.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _submitted_master() -> str | None:
    """The master spark-submit was given (it runs us with its JVM already up)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM: its conf is in system props
    master = SparkConf().get("spark.master")
    return str(master) if master else None


def _all_jars(dialects: set[str]) -> list[str]:
    """The jars `dialects` need (or ConfigError), plus any other driver found: a later session in
    the same JVM (tests, `ckit demo` then another run) keeps the first session's classpath."""
    jars = find_jars(dialects)
    for other in sorted(set(JAR_PATTERNS) - dialects):
        try:
            jars += [j for j in find_jars({other}) if j not in jars]
        except ConfigError:
            continue
    return jars


def _check_submitted_jars(user: dict[str, str]) -> None:
    """Under spark-submit the driver's classpath is fixed before this code runs: setting
    `spark.jars` now would reach the executors but not the driver, which loads the JDBC driver
    to resolve each read's schema. Fail early with the flag to add instead."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM: its conf is in system props
    submitted = SparkConf()
    keys = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
    if any(submitted.get(k) or user.get(k) for k in keys):
        return
    raise ConfigError(
        'spark-submit was given no JDBC driver: add --jars "$(scripts/jdbc.sh jars)" (Debian\'s '
        "libmariadb-java, libxerial-sqlite-jdbc-java and libpostgresql-jdbc-java) or --packages "
        "org.mariadb.jdbc:mariadb-java-client:<version>,org.xerial:sqlite-jdbc:<version>,"
        "org.postgresql:postgresql:<version>")
