"""Spark's Python workers in the tests import PySpark from the installed package (its cached
bytecode), not from Spark's pyspark.zip (worker_python.sh says why)."""

from __future__ import annotations

import pytest
from pyspark.sql.functions import udf
from spark_session import WORKER_PYTHON

pytestmark = pytest.mark.spark


def test_python_workers_import_pyspark_from_the_installed_package(spark):
    @udf("string", useArrow=False)
    def pyspark_file(_):
        import pyspark

        return pyspark.__file__

    files = {row.f for row in spark.range(2).select(pyspark_file("id").alias("f")).collect()}

    assert len(files) == 1 and ".zip" not in files.pop()


def test_installed_data_sources_run_with_the_same_interpreter(spark):
    # format("tidemq") is found among the installed data sources; the JVM runs those (and
    # the streaming source's process) with this interpreter, not with the session's.
    package = spark.sparkContext._jvm.org.apache.spark.api.python
    python_utils = getattr(getattr(package, "PythonUtils$"), "MODULE$")  # a Scala object
    assert python_utils.defaultPythonExec() == str(WORKER_PYTHON)
