#!/bin/sh
# The interpreter Spark runs the tests' Python workers with (PYSPARK_PYTHON, set by
# spark_session.py): $TIDEMQ_SPARK_PYTHON, the test run's own, importing PySpark from the
# installed package instead of the pyspark.zip (and py4j zip) Spark puts first on their
# PYTHONPATH. Both come from the same wheel; but the zip holds no bytecode, so every worker
# compiled PySpark's sources again: 0.7-0.8 s of CPU for the streaming source's process
# against 0.2 s from the package's cached bytecode. On a busy machine (load average 15) that
# process then missed Spark's fixed 10 s to connect back, failing the query.
set -f
kept=""
IFS=:
for entry in $PYTHONPATH; do
    case "$entry" in
        */pyspark/python/lib/*.zip) ;;
        *) kept="${kept:+$kept:}$entry" ;;
    esac
done
unset IFS
PYTHONPATH="$kept"
export PYTHONPATH
exec "${TIDEMQ_SPARK_PYTHON:?the test run's Python interpreter}" "$@"
