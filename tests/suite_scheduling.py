"""Which tests run together on one pytest-xdist worker (scripts/test passes ``--dist loadgroup``).

xdist hands out work units; a unit runs whole on one worker, in collection order. Here a
test's unit comes from its path:

- tests/unit: each test is its own unit (pure, in-process, fast: spread them thin);
- tests/spark and tests/differential: the whole folder is one unit, so the session's
  SparkSession and cluster, or the Apache-and-tidemq pair, start once, not once per worker;
- any other test module (tests/integration, interop, reliability, console): the module is one
  unit, so its module-scoped servers start once and its tests keep their order.

The controller groups by node id alone, through xdist's ``pytest_xdist_make_scheduler`` hook
(tests/conftest.py). xdist's ``xdist_group`` mark does not work here: it renames the items
(``item._nodeid``), which pytest 9.2 ignores; change ``work_unit`` instead.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Folders whose tests share session-scoped servers: one unit each.
SHARED_SESSION_FOLDERS = ("spark", "differential")


def work_unit(nodeid: str) -> str:
    """The unit of ``tests/<folder>/.../test_x.py::test_y[param]`` (see the module doc)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tests" or parts[1] == "unit":
        return nodeid
    if parts[1] in SHARED_SESSION_FOLDERS:
        return f"tests/{parts[1]}"
    return path


class SuiteScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (bigger units first) with :func:`work_unit` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
