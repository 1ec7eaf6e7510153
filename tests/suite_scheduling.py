"""Which tests run together on one pytest-xdist worker, and which start first (scripts/test
passes ``--dist loadgroup``).

xdist hands out work units; a unit runs whole on one worker, in collection order. Here a
test's unit comes from its path:

- tests/unit: each test is its own unit (pure, in-process, fast: spread them thin);
- tests/spark: two units, each with its own SparkSession and cluster (session fixtures): the
  driver-crash tests (``*_crash.py``, a child Spark driver each, the longest Spark tests) and
  the rest; tests/differential: one unit, so the Apache-and-tidemq pair starts once;
- any other test module (tests/integration, interop, reliability, console): the module is one
  unit, so its module-scoped servers start once and its tests keep their order.

The longest units start first (``LONG_UNITS``, then every other module, then unit tests), so
none of them is left running alone at the end of the run.

The controller groups by node id alone, through xdist's ``pytest_xdist_make_scheduler`` hook
(tests/conftest.py). xdist's ``xdist_group`` mark does not work here: it renames the items
(``item._nodeid``), which pytest 9.2 ignores; change ``work_unit`` instead.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

SPARK_CRASH_UNIT = "tests/spark/*_crash.py"
# Folders whose tests share session-scoped servers: one unit each (tests/spark: two).
SHARED_SESSION_FOLDERS = ("spark", "differential")
# Units that take minutes, longest first (measured with --durations under pytest-xdist).
LONG_UNITS = (SPARK_CRASH_UNIT, "tests/spark", "tests/reliability/test_store_bit_flips.py",
              "tests/console/test_console_in_browser.py", "tests/differential")


def work_unit(nodeid: str) -> str:
    """The unit of ``tests/<folder>/.../test_x.py::test_y[param]`` (see the module doc)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tests" or parts[1] == "unit":
        return nodeid
    if parts[1] == "spark" and parts[-1].endswith("_crash.py"):
        return SPARK_CRASH_UNIT
    if parts[1] in SHARED_SESSION_FOLDERS:
        return f"tests/{parts[1]}"
    return path


def start_rank(unit: str) -> int:
    """Units of lower rank start first: LONG_UNITS in order, other modules, single tests."""
    if unit in LONG_UNITS:
        return LONG_UNITS.index(unit)
    return len(LONG_UNITS) + ("::" in unit)


class SuiteScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`work_unit` as the scope and
    :func:`start_rank` as the start order."""

    def __init__(self, config: object, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)

    def _assign_work_unit(self, node: object) -> None:
        if not self._ordered:  # the first assignment: the queue holds every unit
            self._ordered = True
            for unit in sorted(self.workqueue, key=start_rank):  # stable: ties keep order
                self.workqueue.move_to_end(unit)
        super()._assign_work_unit(node)  # type: ignore[arg-type]
