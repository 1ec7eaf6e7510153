"""The SparkSession every Spark test runs on, also built by child driver processes.

Settings that keep tests small and fast: local[2], two shuffle partitions, UI
and console progress off, driver on 127.0.0.1, scratch space (SPARK_LOCAL_DIRS, TMPDIR) under
the test session's temporary folder, adaptive execution off, UTC session time zone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def spark_environment(scratch: Path) -> dict[str, str]:
    """Environment of a Spark driver: loopback only, scratch space under ``scratch``."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(scratch / "local"),
        "TMPDIR": str(scratch / "tmp"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
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
            .getOrCreate()
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    session.sparkContext.setLogLevel("WARN")
    return session
