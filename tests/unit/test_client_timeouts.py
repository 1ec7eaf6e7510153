"""The test-wide client timeouts (tests/client_timeouts.py): switched on, clients built
without timeouts of their own get the generous ones; explicit timeouts win; switched off (as
for every unit test, this one included), the client's own defaults are back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client_timeouts import (
    TEST_REQUEST_TIMEOUT_MS,
    TEST_SEND_TIMEOUT_MS,
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
