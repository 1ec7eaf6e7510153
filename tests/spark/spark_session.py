"""The SparkSession every Spark test runs on, also built by child driver processes.

Settings that keep tests small and fast: local[2], two shuffle partitions, UI
and console progress off, driver on 127.0.0.1, scratch space (SPARK_LOCAL_DIRS, TMPDIR) under
the test session's temporary folder, adaptive execution off, UTC session time zone, the JVM's
quick JIT tier only; Python workers import PySpark's cached bytecode (worker_python.sh).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# Spark's Python workers run this interpreter's PySpark from the installed package, not from
# the bytecode-less pyspark.zip (the script says why).
WORKER_PYTHON = Path(__file__).resolve().parent / "worker_python.sh"
# First on the PYTHONPATH of the JVM and so of its Python workers: their clients get the
# test's client timeouts (client_timeouts.CHILD_SITE_DIR; not imported here, as a child
# driver process runs this module without tests/ on its path).
CHILD_SITE_DIR = Path(__file__).resolve().parent.parent / "child_site"


def spark_environment(scratch: Path) -> dict[str, str]:
    """Environment of a Spark driver: loopback only, scratch space under ``scratch``,
    Python workers started by worker_python.sh with this interpreter, whose clients follow
    the test's client timeouts (tests/child_site)."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(CHILD_SITE_DIR), pythonpath) if p),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(scratch / "local"),
        "TMPDIR": str(scratch / "tmp"),
        "PYSPARK_PYTHON": str(WORKER_PYTHON),
        "TIDEMQ_SPARK_PYTHON": sys.executable,
        # the JVM runs data sources it found installed (format("tidemq")) with this one
        "PYSPARK_DRIVER_PYTHON": str(WORKER_PYTHON),
    }


def build_spark_session(scratch: Path) -> Any:
    """A local[2] SparkSession with the test settings (this process's environment is set for
    the JVM it starts)."""
    from pyspark.sql import SparkSession

    for name in ("local", "tmp"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    # The JVM (and the Python workers it starts) take the environment at launch; put this
    # process's back afterwards so other tests' subprocesses do not inherit it.
    saved = dict(os.environ)
    os.environ.update(spark_environment(scratch))
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("tidemq-spark-tests")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            # The JIT's quick tier only: a session's start and a few small queries cost the
            # JVM 15-17 s of CPU instead of 24-27 s (load 14-25), what a busy machine
            # stretches into minutes; tests run no JVM code long enough to miss the rest.
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .getOrCreate()
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    session.sparkContext.setLogLevel("WARN")
    return session
