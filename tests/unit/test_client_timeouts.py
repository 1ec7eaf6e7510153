"""The test-wide client timeouts (tests/client_timeouts.py): switched on, clients built
without timeouts of their own get the generous ones; explicit timeouts win; switched off (as
for every unit test, this one included), the client's own defaults are back. A child process
started with ``child_pythonpath()`` follows the switch as it was when it started."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from client_timeouts import (
    TEST_REQUEST_TIMEOUT_MS,
    TEST_SEND_TIMEOUT_MS,
    child_pythonpath,
    use_generous_client_timeouts,
)
from tidemq.client import Admin, Producer, PullConsumer, PushConsumer
from tidemq.client.encoded_batch import EncodedBatchSender
from tidemq.client.instance import REQUEST_TIMEOUT_MS
from tidemq.client.producer import SEND_TIMEOUT_MS
from tidemq.sync import Producer as SyncProducer

NAMESRV = "127.0.0.1:9876"  # never contacted: the clients are built, not started


@pytest.fixture
def generous() -> Iterator[None]:
    use_generous_client_timeouts(True)
    try:
        yield
    finally:
        use_generous_client_timeouts(False)


def request_timeouts_ms() -> dict[str, int]:
    return {
        "producer": Producer("g", NAMESRV)._instance.request_timeout_ms,
        "pull": PullConsumer("g", NAMESRV)._instance.request_timeout_ms,
        "push": PushConsumer("g", NAMESRV).instance.request_timeout_ms,
        "admin": Admin(NAMESRV)._instance.request_timeout_ms,
        "encoded": EncodedBatchSender("g", NAMESRV).instance.request_timeout_ms,
    }


def test_unit_tests_build_clients_with_the_clients_own_defaults() -> None:
    assert Producer("g", NAMESRV).send_timeout_ms == SEND_TIMEOUT_MS == 3000
    assert set(request_timeouts_ms().values()) == {REQUEST_TIMEOUT_MS}


def test_switched_on_every_client_defaults_to_the_test_timeouts(generous: None) -> None:
    assert Producer("g", NAMESRV).send_timeout_ms == TEST_SEND_TIMEOUT_MS
    assert EncodedBatchSender("g", NAMESRV).send_timeout_ms == TEST_SEND_TIMEOUT_MS
    assert set(request_timeouts_ms().values()) == {TEST_REQUEST_TIMEOUT_MS}
    with SyncProducer("g", NAMESRV) as twin:  # the twins pass their options on
        assert twin._async.send_timeout_ms == TEST_SEND_TIMEOUT_MS


def test_explicit_timeouts_win_and_built_clients_keep_theirs(generous: None) -> None:
    explicit = Producer("g", NAMESRV, send_timeout_ms=1500, request_timeout_ms=700)
    assert (explicit.send_timeout_ms, explicit._instance.request_timeout_ms) == (1500, 700)
    built = Producer("g", NAMESRV)
    use_generous_client_timeouts(False)
    assert built.send_timeout_ms == TEST_SEND_TIMEOUT_MS
    assert Producer("g", NAMESRV).send_timeout_ms == SEND_TIMEOUT_MS


# A child as the push-failover members and Spark's Python workers are: it builds clients
# after its own imports and prints the timeouts they got.
CHILD = """
import sys
print("client imported at start:", "tidemq.client" in sys.modules)
from tidemq.client import Producer, PushConsumer
print(Producer("g", "127.0.0.1:9876").send_timeout_ms,
      PushConsumer("g", "127.0.0.1:9876").instance.request_timeout_ms,
      Producer("g", "127.0.0.1:9876", send_timeout_ms=1500).send_timeout_ms)
"""


def child_output() -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": child_pythonpath()}, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_child_started_while_switched_on_builds_clients_with_the_test_timeouts(
        generous: None) -> None:
    # Switched on in the child only once it imports the client (nothing before: a child
    # that builds no client pays nothing); explicit timeouts still win there too.
    assert child_output() == ["client imported at start: False",
                              f"{TEST_SEND_TIMEOUT_MS} {TEST_REQUEST_TIMEOUT_MS} 1500"]


def test_a_child_started_while_switched_off_keeps_the_clients_own_defaults() -> None:
    assert child_output() == ["client imported at start: False",
                              f"{SEND_TIMEOUT_MS} {REQUEST_TIMEOUT_MS} 1500"]
