"""The ``make_broker`` fixture (conftest.py) cleans up after a test that fails mid-scenario.

A CI run reported an ERROR ("Event loop is closed") beside a failure: a test's second broker
could not listen, the first one was left running when ``asyncio.run`` closed its loop, and
the fixture's teardown shut it down on a new loop. Now a started broker is shut down on its
own loop as that loop ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


class ScenarioFailed(Exception):
    """Raised by a scenario in place of a failing assertion."""


def test_a_broker_left_running_by_a_failed_scenario_is_shut_down_on_its_own_loop(make_broker):
    broker = make_broker(store_kind="file")

    async def scenario() -> None:
        await broker.start()
        raise ScenarioFailed("the scenario failed before its own shutdown")

    with pytest.raises(ScenarioFailed):
        asyncio.run(scenario())
    assert broker.stopped
    # Shut down through to its last step: the store closed cleanly (its abort marker gone).
    assert not (Path(broker.store_config.store_path_root_dir) / "abort").exists()

