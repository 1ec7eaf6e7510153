"""Spark finds format("tidemq") by itself: the installed top-level pyspark_tidemq module."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest
from pyspark.sql.datasource import DataSource

pytestmark = pytest.mark.spark


def test_the_installed_module_is_what_spark_discovery_finds():
    # Spark's lookup worker imports every top-level module named pyspark_* on the path and
    # registers its DefaultSource under DefaultSource.name().
    found = [info.name for info in pkgutil.iter_modules() if info.name.startswith("pyspark_")]
    assert "pyspark_tidemq" in found
    module = importlib.import_module("pyspark_tidemq")
    assert issubclass(module.DefaultSource, DataSource)
    assert module.DefaultSource.name() == "tidemq"


def test_the_data_source_and_its_readers_and_writers_pickle():
    source = importlib.import_module("pyspark_tidemq").DefaultSource(
        {"namesrvaddr": "127.0.0.1:9876", "subscribe": "Orders"})
    schema = source.schema()

    for made in (source.reader(schema), source.streamReader(schema)):
        assert type(pickle.loads(pickle.dumps(made))) is type(made)
    sink = importlib.import_module("pyspark_tidemq").DefaultSource(
        {"namesrvaddr": "127.0.0.1:9876", "topic": "Orders"})
    for made in (sink.writer(schema, False), sink.streamWriter(schema, False)):
        assert type(pickle.loads(pickle.dumps(made))) is type(made)
