"""The Spark session of the reconciler: local or submitted, JDBC driver jars, loopback-only
driver servers in local mode, and quiet logs."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from consumer_kit.core.errors import ConfigError, ReconcileError
from consumer_kit.core.urls import mask_text
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



#: Spark's own log configuration when the CLI is not verbose: see the file's comments.
QUIET_LOG4J2 = Path(__file__).with_name("log4j2-quiet.properties")

#: The master URLs SparkSubmit accepts (anything else makes its JVM exit with a stack trace).
_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
                     r"(spark|mesos|k8s)://\S+)$")


def check_master(master: str | None) -> None:
    """Refuse a Spark master SparkSubmit would refuse, before any JVM starts.

    Raises:
        ConfigError: naming `--master` and the accepted forms.

    >>> check_master("local[2]"), check_master("spark://head:7077")
    (None, None)
    """
    if master is not None and not _MASTER.match(master):
        raise ConfigError(f"--master {master!r} is not a Spark master: use local[*], local[N], "
                          "spark://HOST:PORT, yarn, k8s://URL or mesos://URL")


def quiet_java_options(options: str, *, verbose: bool) -> str:
    """`spark.driver.extraJavaOptions` with Spark's own log configuration replaced by
    `QUIET_LOG4J2` unless `verbose` (or the options already name a log4j2 configuration).

    pyspark passes the session's settings to the spark-submit that starts its JVM, which puts
    the driver's extra Java options on that JVM's command line: the file is read before Spark
    logs its first line.
    """
    if verbose or "log4j2.configurationFile" in options or not QUIET_LOG4J2.is_file():
        return options
    path = str(QUIET_LOG4J2)
    flag = f'-Dlog4j2.configurationFile="{path}"' if " " in path else \
        f"-Dlog4j2.configurationFile={path}"
    return f"{options} {flag}".strip()


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

    check_master(config.master)
    user = dict(config.spark_conf)
    conf = dict(DEFAULT_SPARK_CONF)
    # Spark's WARN lines and banner only with -v (the CLI's logging at INFO or below)
    verbose = logging.getLogger().getEffectiveLevel() <= logging.INFO
    conf["spark.driver.extraJavaOptions"] = quiet_java_options(
        conf["spark.driver.extraJavaOptions"], verbose=verbose)
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
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # the JVM's stack trace stays out: its first line is enough
        raise ReconcileError(f"Spark did not start: {_first_line(exc)}") from None
    session.sparkContext.setLogLevel("WARN")
    return session


def _first_line(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return mask_text(lines[0] if lines else type(exc).__name__)


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
