"""Gives a test's child process the test-wide client timeouts its parent test has.

A test that starts a Python child process running tidemq clients (a push-consumer group
member, a Spark driver whose executors read and write) puts this folder first on the child's
PYTHONPATH (``client_timeouts.child_pythonpath``), so Python imports this module as the child
starts. When the test that started it had the generous timeouts of tests/client_timeouts.py
switched on (``TIDEMQ_TEST_CLIENT_TIMEOUTS``, set by that module for every test outside
tests/unit), the child's clients default to them too once ``tidemq.client`` is imported;
otherwise this module does nothing.

Lazy on purpose: the switch is made right after the child first imports ``tidemq.client``,
not here, so a child that never builds a client (a Spark Python worker running a UDF) pays
nothing, and one that does pays nothing before it connects back to Spark.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

CHILD_TIMEOUTS_ENV = "TIDEMQ_TEST_CLIENT_TIMEOUTS"  # client_timeouts.py sets it
CLIENT_PACKAGE = "tidemq.client"


def _switch_on() -> None:
    tests_dir = str(Path(__file__).resolve().parent.parent)
    if tests_dir not in sys.path:
        sys.path.append(tests_dir)  # last: the child's own modules keep their names
    from client_timeouts import use_generous_client_timeouts

    use_generous_client_timeouts(True)


class _AfterClientImport(importlib.abc.MetaPathFinder):
    """Finds ``tidemq.client`` as usual and switches the timeouts on once it is executed."""

    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != CLIENT_PACKAGE:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_switch_on(module: ModuleType) -> None:
            exec_module(module)
            _switch_on()

        spec.loader.exec_module = exec_then_switch_on  # type: ignore[method-assign]
        return spec


if os.environ.get(CHILD_TIMEOUTS_ENV) == "generous":
    if CLIENT_PACKAGE in sys.modules:
        _switch_on()
    else:
        sys.meta_path.insert(0, _AfterClientImport())
