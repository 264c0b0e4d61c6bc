"""In local mode the reconcile job's Spark driver listens on loopback only (its RPC and
block-manager servers otherwise bind the address the host name resolves to)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark.session import LOOPBACK_DRIVER_CONF, is_local_master
from tests.net import loopback_only

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: the test session's own SparkSession would be reused otherwise.
CHILD = """
import json, sys
from consumer_kit.reconcile import GroupSource, ReconcileConfig
from spark.session import build_session
from tests.net import listening

config = ReconcileConfig(producer_url="sqlite:///p.db", groups=(GroupSource("g", "sqlite:///c.db"),),
                         master="local[1]")
session = build_session(config, {"sqlite"})
session.range(10).count()
sc = session.sparkContext
ports = {"driver RPC": int(sc.getConf().get("spark.driver.port")),
         "block manager": int(sc._jsc.sc().env().blockManager().blockManagerId().port())}
seen = listening()
print(json.dumps({name: sorted(seen.get(port, ())) for name, port in ports.items()}))
session.stop()
"""


def test_local_masters_are_recognised_and_cluster_masters_are_not() -> None:
    for master in ("local", "local[1]", "local[*]", "local[4,2]"):
        assert is_local_master(master)
    for master in (None, "yarn", "spark://10.0.0.5:7077", "k8s://https://api:6443", "localhost"):
        assert not is_local_master(master)
    assert LOOPBACK_DRIVER_CONF["spark.driver.bindAddress"] == "127.0.0.1"


@pytest.mark.spark
def test_the_jobs_local_driver_listens_on_loopback_only(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, check=False,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                               "HOME": str(tmp_path), **_java_env()})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, addresses in found.items():
        assert loopback_only(set(addresses)), f"Spark {name} listens on {addresses}"


def _java_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "CKIT_JDBC_JARS")}
