"""The suite's pytest-xdist units (tests/suite_scheduling.py): which tests share a worker,
which start first."""

from __future__ import annotations

from suite_scheduling import LONG_UNITS, SPARK_CRASH_UNIT, start_rank, work_unit


def test_unit_tests_spread_one_by_one_and_modules_stay_whole() -> None:
    assert work_unit("tests/unit/store/test_x.py::test_a[1]") == \
        "tests/unit/store/test_x.py::test_a[1]"
    assert work_unit("tests/integration/test_acl.py::test_a") == "tests/integration/test_acl.py"
    assert work_unit("tests/integration/test_acl.py::test_b[x]") == \
        "tests/integration/test_acl.py"


def test_session_folders_share_a_worker_and_spark_crash_tests_get_their_own() -> None:
    assert work_unit("tests/differential/test_admin.py::test_a") == "tests/differential"
    assert work_unit("tests/differential/test_send_pull.py::test_b") == "tests/differential"
    assert work_unit("tests/spark/test_sink.py::test_a") == "tests/spark"
    assert work_unit("tests/spark/test_exactly_once_crash.py::test_a[in_tasks]") == \
        SPARK_CRASH_UNIT
    assert work_unit("tests/spark/test_streaming_crash.py::test_a") == SPARK_CRASH_UNIT


def test_long_units_start_first_then_modules_then_single_tests() -> None:
    units = ["tests/unit/test_x.py::test_a", "tests/integration/test_acl.py",
             *reversed(LONG_UNITS)]
    ordered = sorted(units, key=start_rank)
    assert ordered == [*LONG_UNITS, "tests/integration/test_acl.py",
                       "tests/unit/test_x.py::test_a"]
